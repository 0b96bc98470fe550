#include "core/train/lazy_model.h"

#include "core/util/device.h"
#include "core/util/error.h"

namespace kuafu::train {

void materialize(torch::nn::Module& model, const Materialization& how) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_buffers()) {
    KUAFU_CHECK(!item.value().is_meta(), "buffer ", item.key(), " was made on the meta device; a model built lazily "
                                         "must make its buffers where it runs");
  }
  for (auto& item : model.named_parameters()) {
    torch::Tensor& p = item.value();
    if (!p.is_meta() || (how.holds && !how.holds(item.key()))) continue;
    const torch::Dtype dtype = how.dtype_of ? how.dtype_of(item.key()) : torch::kFloat32;
    auto options = torch::TensorOptions(dtype).device(how.device);
    if (how.on_host && how.on_host(item.key())) options = host_staging_options(how.device).dtype(dtype);
    rebind(p, torch::zeros(p.sizes(), options));
  }
}

bool has_meta_parameters(const torch::nn::Module& model) {
  for (const auto& p : model.parameters()) {
    if (p.is_meta()) return true;
  }
  return false;
}

void give_zeros(const torch::nn::Module& model, const std::function<bool(const std::string&)>& which) {
  const WeightSink* sink = current_weight_sink();
  KUAFU_CHECK(sink, "give_zeros needs a WeightSink in scope (it fills a model left on the meta device)");
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.is_meta() || (which && !which(item.key())) || !sink->wants(item.key())) continue;
    sink->take(item.key(), torch::zeros(p.sizes(), torch::TensorOptions(p.scalar_type()).device(sink->device)));
  }
}

}  // namespace kuafu::train

#include "apps/fastfold/heads.h"

#include <torch/torch.h>

#include "core/nn/chunks.h"

namespace kuafu::fold {

DistogramHeadImpl::DistogramHeadImpl(int64_t c_z, int64_t bins, const torch::Device& device) {
  half_logits = register_module("half_logits", AfLinear(c_z, bins, device, AfInit::kFinal));
}

torch::Tensor DistogramHeadImpl::forward(const torch::Tensor& z, int64_t chunk_size) {
  const torch::ScalarType dtype = half_logits->weights.scalar_type();
  const torch::Tensor half = nn::in_chunks(z.size(0), chunk_size, 0, [&](int64_t start, int64_t n) {
    return half_logits(z.narrow(0, start, n).to(dtype));
  });  // [R, R, bins]
  return half + half.transpose(0, 1);
}

MaskedMsaHeadImpl::MaskedMsaHeadImpl(int64_t c_m, int64_t classes, const torch::Device& device) {
  logits = register_module("logits", AfLinear(c_m, classes, device, AfInit::kFinal));
}

PlddtHeadImpl::PlddtHeadImpl(int64_t c_s, int64_t hidden, int64_t bins, const torch::Device& device) {
  input_layer_norm = register_module("input_layer_norm", AfLayerNorm(c_s, device));
  act_0 = register_module("act_0", AfLinear(c_s, hidden, device, AfInit::kRelu));
  act_1 = register_module("act_1", AfLinear(hidden, hidden, device, AfInit::kRelu));
  logits = register_module("logits", AfLinear(hidden, bins, device, AfInit::kFinal));
}

torch::Tensor PlddtHeadImpl::forward(const torch::Tensor& s) {
  return logits(torch::relu(act_1(torch::relu(act_0(input_layer_norm(s))))));
}

ExperimentallyResolvedHeadImpl::ExperimentallyResolvedHeadImpl(int64_t c_s, const torch::Device& device) {
  logits = register_module("logits", AfLinear(c_s, kAtom37, device, AfInit::kFinal));
}

torch::Tensor plddt_of_logits(const torch::Tensor& logits) {
  const int64_t bins = logits.size(-1);
  const double width = 1.0 / static_cast<double>(bins);
  const torch::Tensor centres = torch::arange(0.5 * width, 1.0, width, logits.options()).narrow(0, 0, bins);
  return (torch::softmax(logits, -1) * centres).sum(-1) * 100.0;
}

}  // namespace kuafu::fold

#include "core/optim/mixed_precision.h"

#include <map>

#include "core/util/error.h"

namespace kuafu::optim {

void add_precision_schema(config::Schema& s) {
  s.add_string("precision.dtype", "fp32",
               "compute dtype: fp32, bf16 or fp16 (fp16 needs CUDA); bf16/fp16 keep float32 master weights; fp64 "
               "(a model built in float64) for numerical checks against references")
      .choices({"fp32", "bf16", "fp16", "fp64"});
  s.add_string("precision.grad_reduce", "float32",
               "bf16/fp16: dtype gradients accumulate over micro-steps and are averaged over the data ranks in. "
               "float32: float32 main gradients (Megatron's main_grad), the average exact to float32, twice the "
               "bytes sent; compute: the compute dtype, each rank's gradient divided by the number of ranks before "
               "the sum (so an fp16 sum cannot overflow where the average fits), rounded to bf16/fp16 at every "
               "micro-step and in the sum. No effect in fp32")
      .choices({"float32", "compute"});
  s.add_string("precision.loss_scale", "auto", "auto (dynamic for fp16, none otherwise), dynamic or none")
      .choices({"auto", "dynamic", "none"});
  s.add_float("precision.initial_scale", 65536.0, "dynamic loss scale: starting scale").min(1);
  s.add_float("precision.growth_factor", 2.0, "dynamic loss scale: growth factor").min(1.000001);
  s.add_float("precision.backoff_factor", 0.5, "dynamic loss scale: back-off factor on overflow").min(1e-6).max(0.999999);
  s.add_int("precision.growth_interval", 1000, "dynamic loss scale: clean steps before growing").min(1);
  s.add_int("precision.hysteresis", 2, "dynamic loss scale: overflows tolerated before backing off").min(1);
  s.add_float("precision.min_scale", 1.0, "dynamic loss scale: lower bound").min(1e-30);
  s.add_float("precision.max_scale", 16777216.0, "dynamic loss scale: upper bound").min(1);
  s.add_int("precision.max_overflows_at_min_scale", 50,
            "dynamic loss scale: overflowing steps in a row at precision.min_scale that stop the run (0: never)")
      .min(0);
}

torch::Dtype dtype_named(const std::string& precision) {
  if (precision == "bf16") return torch::kBFloat16;
  if (precision == "fp16") return torch::kFloat16;
  if (precision == "fp64") return torch::kFloat64;
  return torch::kFloat32;
}

GradReduce grad_reduce(const config::Config& config) {
  return config.get_string("precision.grad_reduce") == "compute" ? GradReduce::kCompute : GradReduce::kFloat32;
}

bool low_precision(torch::Dtype dtype) { return dtype == torch::kBFloat16 || dtype == torch::kHalf; }

torch::Dtype grad_dtype(torch::Dtype param_dtype, GradReduce mode) {
  return low_precision(param_dtype) && mode == GradReduce::kFloat32 ? torch::kFloat32 : param_dtype;
}

GradAverage grad_average(torch::Dtype reduce_dtype, int64_t ranks) {
  if (ranks == 1) return {};
  const double inverse = 1.0 / static_cast<double>(ranks);
  return low_precision(reduce_dtype) ? GradAverage{inverse, 1.0} : GradAverage{1.0, inverse};
}

std::optional<DynamicLossScaler> make_loss_scaler(const config::Config& config, torch::Dtype compute) {
  const std::string mode = config.get_string("precision.loss_scale");
  const bool dynamic = mode == "dynamic" || (mode == "auto" && compute == torch::kFloat16);
  if (!dynamic) return std::nullopt;
  LossScalerOptions o;
  o.initial_scale = config.get_float("precision.initial_scale");
  o.growth_factor = config.get_float("precision.growth_factor");
  o.backoff_factor = config.get_float("precision.backoff_factor");
  o.growth_interval = config.get_int("precision.growth_interval");
  o.hysteresis = config.get_int("precision.hysteresis");
  o.min_scale = config.get_float("precision.min_scale");
  o.max_scale = config.get_float("precision.max_scale");
  o.max_overflows_at_min = config.get_int("precision.max_overflows_at_min_scale");
  if (o.min_scale > o.initial_scale || o.initial_scale > o.max_scale) {
    config.fail_at("precision.initial_scale", "must lie between precision.min_scale and precision.max_scale");
  }
  return DynamicLossScaler(o);
}

MasterWeights::MasterWeights(torch::nn::Module& model, torch::Dtype dtype) : model_(model) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    torch::Tensor& p = item.value();
    if (!p.requires_grad()) continue;  // frozen: cast below
    if (!low_precision(dtype) || !p.is_floating_point()) {  // full precision: the parameter is its own master
      if (p.is_floating_point() && p.scalar_type() != dtype) p.set_data(p.data().to(dtype));  // made in float32, fp64 runs
      masters_.push_back({item.key(), p, nullptr, true});
      continue;
    }
    torch::Tensor master = p.detach().to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
    p.set_data(p.data().to(dtype));
    masters_.push_back({item.key(), master, nullptr, true});
    model_params_.push_back(p);
  }
  if (has_copies()) cast_floating_buffers(model, dtype);
  cast_frozen_parameters(model, dtype);
}

void cast_frozen_parameters(torch::nn::Module& model, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (!p.requires_grad() && p.is_floating_point() && p.scalar_type() != dtype) p.set_data(p.data().to(dtype));
  }
}

void cast_floating_buffers(torch::nn::Module& model, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  for (auto& buffer : model.buffers()) {
    if (buffer.is_floating_point()) buffer.set_data(buffer.data().to(dtype));
  }
}

io::NamedTensors weights_replacing(const torch::nn::Module& model,
                                   const std::map<std::string, torch::Tensor>& replaced) {
  io::NamedTensors out;
  for (const auto& item : model.named_parameters()) {
    const auto found = replaced.find(item.key());
    out.emplace_back(item.key(), found != replaced.end() ? found->second : item.value());
  }
  for (const auto& item : model.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

void MasterWeights::use_grads(const io::NamedTensors& grads) {
  const std::map<std::string, torch::Tensor> grad_of(grads.begin(), grads.end());
  for (size_t i = 0; i < model_params_.size(); ++i) {
    torch::Tensor& master = masters_[i].tensor;
    const auto found = grad_of.find(masters_[i].name);
    if (found == grad_of.end() || found->second.scalar_type() != master.scalar_type()) continue;
    KUAFU_CHECK(found->second.sizes() == master.sizes() && found->second.device() == master.device(),
                "the gradient given for master '", masters_[i].name, "' has shape ", found->second.sizes(), " on ",
                found->second.device(), ", the master ", master.sizes(), " on ", master.device());
    master.mutable_grad() = found->second;
  }
}

void MasterWeights::copy_grads_to_masters() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < model_params_.size(); ++i) {
    const torch::Tensor& g = model_params_[i].grad();
    torch::Tensor& master = masters_[i].tensor;
    if (!g.defined()) continue;
    if (!master.grad().defined()) {
      master.mutable_grad() = g.to(torch::kFloat32);
    } else {
      master.mutable_grad().copy_(g);
    }
  }
}

void MasterWeights::copy_masters_to_model() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < model_params_.size(); ++i) model_params_[i].copy_(masters_[i].tensor);
}

io::NamedTensors MasterWeights::weights() const {
  std::map<std::string, torch::Tensor> master_of;
  for (const auto& m : masters_) master_of[m.name] = m.tensor;
  return weights_replacing(model_, master_of);
}

}  // namespace kuafu::optim

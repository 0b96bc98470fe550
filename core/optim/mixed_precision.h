// Mixed precision: the model computes in bf16 or fp16 while the optimizer updates float32 master
// weights; the precision.* config keys; the loss scaler the config asks for.
#pragma once

#include <map>
#include <optional>

#include "core/config/config.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/optimizer.h"

namespace kuafu::optim {

void add_precision_schema(config::Schema& schema);

// precision.grad_reduce: the dtype bf16/fp16 gradients accumulate over micro-steps and are reduced over
// the data ranks in.
enum class GradReduce {
  kFloat32,  // float32 main gradients (Megatron's main_grad): the average is exact to float32
  kCompute,  // the compute dtype: half the bytes; divided by the ranks before summing
};
GradReduce grad_reduce(const config::Config& config);

bool low_precision(torch::Dtype dtype);  // bf16 or fp16

// The dtype in which gradients of parameters of `param_dtype` accumulate and are reduced: float32 for
// bf16/fp16 unless `mode` is kCompute, otherwise the parameters' own.
torch::Dtype grad_dtype(torch::Dtype param_dtype, GradReduce mode);

// A gradient average over `ranks` as scale, sum, scale. In bf16/fp16 the division comes before the sum,
// as PyTorch DDP's gradient_predivide_factor, so that an fp16 sum cannot overflow where the average
// would not; in float32 (or float64) it comes after, one rounding fewer.
struct GradAverage {
  double before_sum = 1.0;
  double after_sum = 1.0;
};
GradAverage grad_average(torch::Dtype reduce_dtype, int64_t ranks);

// A precision.dtype value ("fp32", "bf16", "fp16", "fp64") as a torch dtype. A run reads it once per model
// through train::compute_dtype, which also refuses fp16 on the CPU.
torch::Dtype dtype_named(const std::string& precision);

// The loss scaler precision.loss_scale asks for ("auto": dynamic for an fp16 `compute` dtype, none otherwise).
std::optional<DynamicLossScaler> make_loss_scaler(const config::Config& config, torch::Dtype compute);

// Frozen floating-point parameters (a LoRA base) to `dtype`: they need no masters and compute, and are
// held, in the compute dtype.
void cast_frozen_parameters(torch::nn::Module& model, torch::Dtype dtype);

// Floating-point buffers (e.g. norms' running statistics) follow the compute dtype: they are computed
// with the activations.
void cast_floating_buffers(torch::nn::Module& model, torch::Dtype dtype);

// The model's parameters and buffers under their names, the parameters named in `replaced` given as
// those tensors instead (float32 masters, gathered shards): what a checkpoint stores as the model.
io::NamedTensors weights_replacing(const torch::nn::Module& model,
                                   const std::map<std::string, torch::Tensor>& replaced);

class MasterWeights {
 public:
  // Casts the model's floating-point parameters to `dtype`. For bf16 and fp16 it first keeps float32
  // copies (from the float32 weights, so nothing is rounded) that the optimizer updates; in full precision
  // (fp32, fp64) the parameters are their own masters.
  MasterWeights(torch::nn::Module& model, torch::Dtype dtype);

  // What the optimizer updates: the masters, or the model's own parameters in float32 training.
  const std::vector<Param>& params() const { return masters_; }
  bool has_copies() const { return !model_params_.empty(); }

  // The float32 tensors in `grads` (by parameter name: e.g. DataParallel's main gradients, which it fills
  // in place) become the masters' .grad, so nothing is copied: their model parameters keep no .grad, and
  // copy_grads_to_masters passes them by. Gradients in another dtype are left to copy_grads_to_masters.
  void use_grads(const io::NamedTensors& grads);
  // master.grad <- float32(model.grad) for the model parameters that hold a .grad (no-op without copies).
  void copy_grads_to_masters();
  // model weights <- rounded masters (no-op without copies).
  void copy_masters_to_model();
  // Masters plus the model's buffers under the model's names: what a checkpoint stores as the model.
  io::NamedTensors weights() const;

 private:
  torch::nn::Module& model_;
  std::vector<Param> masters_;
  std::vector<torch::Tensor> model_params_;  // [i] is the low-precision parameter of masters_[i]
};

}  // namespace kuafu::optim

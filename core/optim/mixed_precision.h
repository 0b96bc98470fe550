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

// precision.dtype as a torch dtype; fp16 on a CPU device fails at the key (LibTorch's CPU kernels lack it).
torch::Dtype compute_dtype(const config::Config& config, const torch::Device& device);

// The loss scaler precision.loss_scale asks for ("auto": dynamic for fp16, none otherwise).
std::optional<DynamicLossScaler> make_loss_scaler(const config::Config& config);

// Floating-point buffers (e.g. norms' running statistics) follow the compute dtype: they are computed
// with the activations.
void cast_floating_buffers(torch::nn::Module& model, torch::Dtype dtype);

// The model's parameters and buffers under their names, the parameters named in `replaced` given as
// those tensors instead (float32 masters, gathered shards): what a checkpoint stores as the model.
io::NamedTensors weights_replacing(const torch::nn::Module& model,
                                   const std::map<std::string, torch::Tensor>& replaced);

class MasterWeights {
 public:
  // Casts the model's floating-point parameters to `dtype`. For a dtype other than float32 it first
  // keeps float32 copies (from the float32 weights, so nothing is rounded) that the optimizer updates.
  MasterWeights(torch::nn::Module& model, torch::Dtype dtype);

  // What the optimizer updates: the masters, or the model's own parameters in float32 training.
  const std::vector<Param>& params() const { return masters_; }
  bool has_copies() const { return !model_params_.empty(); }

  // master.grad <- float32(model.grad) (no-op without copies).
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

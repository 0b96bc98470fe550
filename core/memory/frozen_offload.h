// Frozen weights (a LoRA base) kept in host memory and brought to the device one block at a time: the
// device holds only the block being computed, as ZeRO-3 offload does for a PEFT fine-tune. Needs
// activation checkpointing, so that no forward keeps a block's weights for its backward: a block's
// weights come in before its forward and again before its recomputation in backward, and leave after
// each. Installed on a model through the block-call interface (hooks::BlockHooks).
#pragma once

#include <map>
#include <vector>

#include "core/hooks/block_hooks.h"

namespace kuafu::memory {

class FrozenWeightOffload : public hooks::BlockHooks {
 public:
  // Moves every frozen floating-point parameter of `model` to host memory (page-locked when `device` is
  // a GPU; one made there already stays); each block's go to `device` around its calls.
  FrozenWeightOffload(torch::nn::Module& model, const torch::Device& device);
  ~FrozenWeightOffload() override;  // the weights return to the device

  void pre_forward(const hooks::BlockCall& call) override { fetch(call); }
  void post_forward(const hooks::BlockCall& call) override { release(call); }
  void pre_backward(const hooks::BlockCall& call) override { fetch(call); }
  void post_backward(const hooks::BlockCall& call) override { release(call); }

  std::string describe() const;
  int64_t host_bytes() const { return host_bytes_; }  // the weights' home in host memory

 private:
  struct Frozen {
    torch::Tensor parameter;  // the model's tensor, whose data moves
    torch::Tensor host;       // its home
  };
  void fetch(const hooks::BlockCall& call);
  void release(const hooks::BlockCall& call);
  std::vector<Frozen*> frozen_of(const hooks::BlockCall& call);

  torch::Device device_;
  std::map<torch::TensorImpl*, Frozen> frozen_;  // by the parameter's identity, which set_data keeps
  int64_t host_bytes_ = 0;
};

}  // namespace kuafu::memory

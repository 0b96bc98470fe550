// A model a run computes with but does not train: PPO's reference and reward models, a diffusion run's
// VAE and text encoder. No optimizer and no gradients; its weights are held in its compute dtype
// (precision.dtype of its config section), optionally in host memory and brought to the device one
// block at a time around its forward (memory.offload_frozen, through the block hooks); checkpoints hold
// it only when asked (a reward model that never changes need not be copied into every checkpoint).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/config/config.h"
#include "core/hooks/block_hooks.h"
#include "core/train/checkpoint.h"
#include "core/train/lazy_model.h"
#include "core/train/runtime.h"

namespace kuafu::memory {
class FrozenWeightOffload;  // core/memory/frozen_offload.h
}  // namespace kuafu::memory

namespace kuafu::train {

struct FrozenModelOptions {
  std::string name;   // its part of the checkpoint
  bool saved = false; // checkpoints hold its weights, and a resume restores them
  // Installs (null: removes) hooks around the model's blocks; false when it cannot (memory.offload_frozen).
  std::function<bool(hooks::BlockHooks*)> set_block_hooks;
};

// A task's frozen model as any command runs it, with or without a trainer: evaluation mode (no dropout)
// and no gradients.
void freeze(torch::nn::Module& model);

class FrozenModel {
 public:
  // Reads precision.dtype and memory.offload_frozen from `config` (the model's view). The model's
  // parameters must be on runtime.device, or under memory.offload_frozen in host memory already
  // (materialization_of); they stop requiring gradients.
  FrozenModel(const config::Config& config, const Runtime& runtime, torch::nn::Module& model, FrozenModelOptions options);
  ~FrozenModel();
  FrozenModel(const FrozenModel&) = delete;
  FrozenModel& operator=(const FrozenModel&) = delete;

  // The dtype a run holds its frozen model `name` in: the compute dtype of its section models.<name>
  // (the run's precision.dtype where that section says none), which the constructor casts to and a
  // loader can make the model in straight away.
  static torch::Dtype dtype_of(const config::Config& config, const std::string& name, const torch::Device& device);
  // How a loader makes frozen model `name` as the run holds it: every parameter in dtype_of's dtype, in
  // host memory (page-locked on a GPU) under its section's memory.offload_frozen, so that no copy of it
  // is made on the device first.
  static Materialization materialization_of(const config::Config& config, const std::string& name, const torch::Device& device);

  const std::string& name() const { return options_.name; }
  torch::Dtype compute_dtype() const { return dtype_; }
  bool offloaded() const { return offload_ != nullptr; }
  // Bytes of its weights kept in host memory (memory.offload_frozen), 0 when not offloaded.
  int64_t host_bytes() const;
  // Bytes of its weights in files on the disk tier (memory.disk_dir), 0 when not there.
  int64_t disk_bytes() const;
  // Its weights as a checkpoint part (whole tensors, in the compute dtype), or none unless saved.
  std::vector<CheckpointPart> checkpoint_parts() const;
  // Restores the weights a checkpoint holds for it (when saved); kuafu::Error naming the folder otherwise.
  void load(const std::string& folder);

 private:
  torch::nn::Module& model_;
  FrozenModelOptions options_;
  torch::Dtype dtype_;
  std::unique_ptr<memory::FrozenWeightOffload> offload_;
  bool hooks_installed_ = false;
};

}  // namespace kuafu::train

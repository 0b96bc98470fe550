// Frozen weights (a LoRA base, PPO's reference model) kept in host memory, or in files on the disk tier,
// and brought to the device one block at a time: the device holds only the block being computed, as ZeRO-3
// offload does for a PEFT fine-tune (ZeRO-Infinity for the disk). Needs
// activation checkpointing, so that no forward keeps a block's weights for its backward: a block's
// weights come in before its forward and again before its recomputation in backward, and leave after
// each. Installed on a model through the block-call interface (hooks::BlockHooks). On the disk tier the
// next call's weights are read ahead while the current block computes: the call that followed this one last
// time (blocks run in the same order every step), so from the second pass on a block rarely waits for the disk.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/hooks/block_hooks.h"
#include "core/io/safetensors.h"
#include "core/memory/disk_tier.h"

namespace kuafu::memory {

class FrozenWeightOffload : public hooks::BlockHooks {
 public:
  // Moves every frozen floating-point parameter of `model` to host memory (page-locked when `device` is
  // a GPU; one made there already stays); each block's go to `device` around its calls. With `disk`
  // (memory.disk_dir) their home is a file each in the run's scratch folder there instead: host memory
  // then holds only the block being computed, read from the disk around its call.
  FrozenWeightOffload(torch::nn::Module& model, const torch::Device& device, std::optional<DiskTierOptions> disk = {});
  ~FrozenWeightOffload() override;  // the weights return to the device

  void pre_forward(const hooks::BlockCall& call) override { fetch(call, "forward "); }
  void post_forward(const hooks::BlockCall& call) override { release(call); }
  void pre_backward(const hooks::BlockCall& call) override { fetch(call, "backward "); }
  void post_backward(const hooks::BlockCall& call) override { release(call); }

  std::string describe() const;
  int64_t host_bytes() const { return host_bytes_; }  // the weights' home in host memory (0 on the disk)
  int64_t disk_bytes() const { return disk_bytes_; }  // their home on the disk tier
  bool on_disk() const { return disk_ != nullptr; }
  int64_t calls_read_ahead() const { return calls_read_ahead_; }  // calls whose weights were read before them

  // A checkpoint of weights whose home is the disk (the model's tensors are then shapes without memory):
  // `weights` (named_weights of the model) with each of them replaced by a host copy read from its file,
  // for as long as the caller holds them; and such copies (after a checkpoint was loaded into them)
  // written back to the files. Other entries pass through.
  io::NamedTensors with_values_from_disk(io::NamedTensors weights);
  void write_values_to_disk(const io::NamedTensors& weights);

 private:
  struct Frozen {
    torch::Tensor parameter;  // the model's tensor, whose data moves
    torch::Tensor host;       // its home (on the disk tier: its shape on the host without memory, while it is away)
    int64_t chunk = -1;       // its file on the disk tier, or -1
  };
  // A host tensor of `f`'s shape with its values (queued to be read from the disk tier when it lives there:
  // wait for `pending` before reading it).
  torch::Tensor from_home(Frozen& f, DiskTransfer* pending);
  // A call's weights read (or being read) into host tensors; `key` is the call's kind and name.
  struct Reads {
    std::string key;
    std::vector<Frozen*> frozen;
    std::vector<torch::Tensor> homes;
    std::vector<DiskTransfer> transfers;
  };
  Reads start_reads(const std::string& key, const std::vector<Frozen*>& frozen);
  // Notes that call `key` (of the `frozen` weights) followed the previous one, and starts the reads of the
  // call that followed `key` last time.
  void read_ahead(const std::string& key, const std::vector<Frozen*>& frozen);
  void drop_read_ahead();                    // waits for its transfers (they write into its tensors)
  void fetch(const hooks::BlockCall& call, const std::string& kind);
  void release(const hooks::BlockCall& call);
  std::vector<Frozen*> frozen_of(const hooks::BlockCall& call);

  torch::Device device_;
  std::map<torch::TensorImpl*, Frozen> frozen_;  // by the parameter's identity, which set_data keeps
  std::map<std::string, torch::TensorImpl*> named_;  // the model's parameter names of the frozen ones
  int64_t host_bytes_ = 0, disk_bytes_ = 0;
  std::unique_ptr<DiskTier> disk_;
  std::map<std::string, std::vector<Frozen*>> frozen_by_call_;  // by call key
  std::map<std::string, std::string> next_call_;                 // call key -> the key that followed it last
  std::string last_call_;
  std::optional<Reads> ahead_;
  int64_t calls_read_ahead_ = 0;
};

}  // namespace kuafu::memory

// ZeRO stages 1 and 2 over the data-parallel group (Rajbhandari et al., 2020). The parameters live in
// chunks laid out in reverse registration order (the order backward produces gradients); rank r keeps
// the float32 masters and optimizer state of shard r of every chunk only. Stage 1 accumulates whole
// gradients and reduce-scatters them once per step; stage 2 reduce-scatters every micro-step's
// gradients chunk by chunk while backward runs and keeps only its shard, so whole gradients never
// persist. Under bf16/fp16, unless grad_reduce is kCompute, stage 1 accumulates in float32 whole
// gradients and both stages reduce-scatter in float32 (stage 2 stages each micro-step's gradients in the
// compute dtype, which is exact, and widens a chunk for its collective). After the optimizer steps its
// shards, one all-gather per chunk gives every rank the whole updated model.
#pragma once

#include <memory>
#include <vector>

#include "core/memory/chunked_masters.h"

namespace kuafu::memory {

struct ZeroOptions {
  int stage = 1;                         // 1: optimizer state sharded; 2: gradients too
  int64_t chunk_numel = 0;               // elements per chunk; 0: search
  torch::Dtype dtype = torch::kFloat32;  // the model's compute dtype (masters stay float32)
  optim::GradReduce grad_reduce = optim::GradReduce::kFloat32;  // precision.grad_reduce
  DeferredWeights deferred = {};  // how trainable parameters left on the meta device get their values
};

class ZeroRedundancy : public ChunkedMasters {
 public:
  // Broadcasts rank 0's parameters and buffers, moves the model's trainable parameters into chunks,
  // keeps float32 masters of this rank's shards and casts the model to options.dtype.
  ZeroRedundancy(torch::nn::Module& model, dist::GroupPtr group, const ZeroOptions& options);
  ~ZeroRedundancy() override;

  int stage() const { return stage_; }
  void begin_backward(bool sync) override;
  void finish_backward() override;
  void reduce_accumulated() override;
  void zero_grad() override;
  // One all-gather per chunk.
  void copy_masters_to_model() override;
  std::string describe() const override;

 private:
  void set_compute_weights(int64_t i, const torch::Tensor& full) override;
  void on_grad_ready(int64_t tensor) override;
  void launch_ready_chunks();
  void launch(int64_t chunk);
  void drain();  // launches what is left and adds every chunk's reduction into the shards

  int stage_;
  std::vector<torch::Tensor> param_chunks_;  // [chunk] whole chunk in the compute dtype
  std::vector<torch::Tensor> grad_chunks_;   // [chunk] stage 1: whole gradients (grad_dtype_); stage 2: staging in backward
  std::vector<int64_t> pending_;             // [chunk] gradients not yet ready this backward
  std::vector<dist::PendingTensor> in_flight_;
  int64_t next_to_launch_ = 0;
  bool sync_ = true;
  bool in_backward_ = false;
};

}  // namespace kuafu::memory

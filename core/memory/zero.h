// ZeRO stages 1 and 2 over the data-parallel group (Rajbhandari et al., 2020). The model's parameters
// live in chunks (ChunkLayout, reverse registration order: the order backward produces gradients), and
// rank r of P keeps the float32 master weights and optimizer state of shard r of every chunk only.
// Stage 1 accumulates whole gradients and reduce-scatters them once per step; stage 2 reduce-scatters
// each micro-step's gradients chunk by chunk while backward runs and keeps only its shard, so whole
// gradients never persist. After the optimizer steps its shards, one all-gather per chunk gives every
// rank the whole updated model.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dist/collectives.h"
#include "core/io/safetensors.h"
#include "core/memory/chunk_layout.h"
#include "core/optim/optimizer.h"

namespace kuafu::memory {

struct ZeroOptions {
  int stage = 1;                         // 1: optimizer state sharded; 2: gradients too
  int64_t chunk_numel = 0;               // elements per chunk; 0: search_chunk_numel up to kMaxChunkBytes
  torch::Dtype dtype = torch::kFloat32;  // the model's compute dtype (masters stay float32)
};

// Upper end of the chunk-size search, in bytes of the compute dtype.
constexpr int64_t kMaxChunkBytes = 32 << 20;

class ZeroRedundancy {
 public:
  // Broadcasts rank 0's parameters and buffers, moves the model's trainable parameters into chunks,
  // keeps float32 masters of this rank's shards and casts the model to options.dtype.
  ZeroRedundancy(torch::nn::Module& model, dist::GroupPtr group, const ZeroOptions& options);
  ~ZeroRedundancy();
  ZeroRedundancy(const ZeroRedundancy&) = delete;
  ZeroRedundancy& operator=(const ZeroRedundancy&) = delete;

  // What the optimizer steps: this rank's piece of every trainable parameter, under the parameter's
  // name, as a 1-D view of its master shard (empty where the rank holds none of it); after
  // finish_backward its .grad is the gradient averaged over the group. shard_group is the data group,
  // so per-parameter norms (LAMB, LARS) add the pieces of every rank.
  const std::vector<optim::Param>& params() const { return pieces_; }
  const ChunkLayout& layout() const { return *layout_; }
  int stage() const { return stage_; }

  // As DataParallel: call before each micro-step's backward (`sync` false: accumulate only) and after
  // the last one.
  void begin_backward(bool sync);
  void finish_backward();
  void zero_grad();
  // Every rank's updated shards into every rank's model: one all-gather per chunk.
  void copy_masters_to_model();

  // Checkpoints hold whole tensors. Collective: the float32 masters (and buffers) under the model's names.
  io::NamedTensors full_weights() const;
  // Collective: optimizer state_tensors() of pieces gathered into whole "<param>/<slot>" tensors.
  io::NamedTensors full_state(const io::NamedTensors& piece_state) const;
  // Whole, uninitialised float32 tensors for every parameter plus the model's buffers: what a
  // checkpoint loads into before load_full_weights (no communication).
  io::NamedTensors weights_to_load() const;
  // weights_to_load() tensors, now filled, into this rank's masters and the model.
  void load_full_weights(const io::NamedTensors& weights);
  // A whole saved tensor of parameter `name` (e.g. its optimizer state) cut to this rank's piece.
  torch::Tensor piece_of(const std::string& name, const torch::Tensor& full) const;

  // Bytes this rank holds persistently for model states: the model's chunks, master shards, gradient
  // shards and (stage 1) whole gradient chunks. Optimizer state is the optimizer's.
  int64_t model_state_bytes() const;

 private:
  struct GradReadyHook;
  void on_grad_ready(int64_t tensor);
  void launch_ready_chunks();
  void launch(int64_t chunk);
  void drain();  // launches what is left and adds every chunk's reduction into the shards
  int64_t index_of(const std::string& name) const;

  torch::nn::Module& model_;
  dist::GroupPtr group_;
  int stage_;
  int rank_;
  torch::Dtype dtype_;
  std::vector<std::string> names_;            // trainable parameters in layout order
  std::vector<torch::Tensor> params_;         // the model's parameters (views into param_chunks_)
  std::optional<ChunkLayout> layout_;
  std::vector<torch::Tensor> param_chunks_;   // [chunk] whole chunk in the compute dtype
  std::vector<torch::Tensor> master_shards_;  // [chunk] this rank's shard, float32 (a view of the chunk in fp32)
  std::vector<torch::Tensor> grad_shards_;    // [chunk] averaged gradient of the shard, float32
  std::vector<torch::Tensor> grad_chunks_;    // [chunk] stage 1: whole gradients; stage 2: staging in backward
  std::vector<optim::Param> pieces_;          // registration order
  std::vector<int64_t> pending_;              // [chunk] gradients not yet ready this backward
  std::vector<dist::PendingTensor> in_flight_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keep the hooks alive
  int64_t next_to_launch_ = 0;
  bool sync_ = true;
  bool in_backward_ = false;
};

}  // namespace kuafu::memory

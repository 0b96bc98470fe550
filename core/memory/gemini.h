// Gemini (Colossal-AI's chunk-based memory manager), here its ZeRO-3 core: the parameters live in
// chunks laid out in registration order (close to the order the blocks run), each chunk sharded over the
// data group so rank r keeps shard r of the compute-dtype weights, the float32 masters and the optimizer
// state. Through the block-call interface (core/nn/block_hooks.h) a chunk is gathered before a block that
// uses it computes and released after, in forward and again in backward; once every tensor of a chunk
// has its gradient, the chunk's gradients are reduce-scattered into the float32 gradient shards and the
// chunk is released. Every tensor's state follows the legal transitions of tensor_state.h.
//
// A released chunk frees its storage in place (the parameters and any views autograd saved share it),
// so a tensor saved for backward takes no memory until pre_backward gathers its chunk again.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "core/memory/chunked_masters.h"
#include "core/memory/tensor_state.h"
#include "core/nn/block_hooks.h"

namespace kuafu::memory {

struct GeminiOptions {
  int64_t chunk_numel = 0;               // elements per chunk; 0: search
  torch::Dtype dtype = torch::kFloat32;  // the model's compute dtype (masters stay float32)
};

class Gemini : public ChunkedMasters, public nn::BlockHooks {
 public:
  // Broadcasts rank 0's weights, moves the trainable parameters into chunks, keeps this rank's shards
  // and releases every chunk. The model must then run its blocks through run_block with this object as
  // hooks: a parameter read outside a block sees a released chunk.
  Gemini(torch::nn::Module& model, dist::GroupPtr group, const GeminiOptions& options);
  ~Gemini() override;

  // Gradients are reduce-scattered during every backward (accumulation adds into the shards).
  void begin_backward(bool sync) override;
  void finish_backward() override;
  void zero_grad() override;
  // Masters into the compute-dtype shards; chunks gather lazily before their next use.
  void copy_masters_to_model() override;
  std::string describe() const override;

  void pre_forward(const nn::BlockCall& call) override;
  void post_forward(const nn::BlockCall& call) override;
  void pre_backward(const nn::BlockCall& call) override;
  void post_backward(const nn::BlockCall& call) override;

  TensorState state(int64_t tensor) const { return states_.at(tensor); }
  bool gathered(int64_t chunk) const { return gathered_.at(chunk); }
  // Bytes of whole chunks gathered now, and the most at any moment so far.
  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }

 private:
  void set_compute_weights(int64_t i, const torch::Tensor& full) override;
  const std::vector<int64_t>& tensors_of(const nn::BlockCall& call);
  void move(int64_t tensor, TensorState to);
  void gather_for_compute(const nn::BlockCall& call);  // pre_forward and pre_backward alike
  void gather(int64_t chunk);
  void release_if_idle(int64_t chunk);
  void on_grad_ready(int64_t tensor) override;
  void reduce_if_complete(int64_t chunk);
  void settle(int64_t tensor);  // walks a tensor to HOLD after a backward by legal steps

  bool keep_payload_;                         // a group of one: the shard is the whole chunk, never freed
  std::vector<torch::Tensor> payloads_;       // [chunk] whole chunk, compute dtype; storage freed when released
  std::vector<torch::Tensor> shards_;         // [chunk] this rank's shard in the compute dtype
  std::vector<torch::Tensor> grad_staging_;   // [chunk] whole-chunk gradients while backward runs
  std::vector<bool> gathered_;
  std::vector<bool> reduced_;                 // [chunk] reduced in this backward
  std::vector<TensorState> states_;
  std::vector<bool> grad_ready_;
  std::map<std::string, std::vector<int64_t>> block_tensors_;  // block name -> tensor indices
  std::map<const void*, int64_t> index_of_impl_;               // parameter TensorImpl -> tensor index
  bool in_backward_ = false;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_bytes_ = 0;
};

}  // namespace kuafu::memory

// Gemini (Colossal-AI's chunk-based memory manager). The parameters live in chunks laid out in
// registration order (close to the order the blocks run), each chunk sharded over the data group so
// rank r keeps shard r of the compute-dtype weights, the float32 masters and the optimizer state (ZeRO-3).
// Through the block-call interface (core/hooks/block_hooks.h) a chunk is gathered whole on the compute
// device before a block that uses it computes, in forward and again in backward; once every tensor of a
// chunk has its gradient, the chunk's gradients are reduce-scattered into the float32 gradient shards
// (staged in the compute dtype, which is exact, and reduced in float32 unless grad_reduce is kCompute).
// Every tensor's state follows the legal transitions of tensor_state.h.
//
// Placement (gemini_placement.cpp) spreads the chunks over two tiers, the device ("fast") and host
// memory ("slow"), each with a budget kept by a TierLedger:
// Under both, a disk tier (memory.disk_dir) takes the master chunks host memory cannot hold
// (disk_masters.h): a third tier, streamed through host memory for the optimizer step.
//   static: fixed fractions of the compute shards and of the master chunks (masters, gradients,
//           optimizer state) live in host memory; a gathered chunk is released right after its block;
//   auto:   the first micro-step (warm-up) records which chunks each block call uses and the non-model
//           memory (activations) around it; afterwards gathered chunks stay on the device while they fit
//           and the one whose next use is furthest ahead is evicted when room is needed, the next
//           block's chunks are fetched ahead when they fit (on a side stream on CUDA, while the current
//           block computes), and the room left spare after warm-up times
//           memory.margin_ratio holds master chunks on the device: first those on the disk tier
//           (the latest used in the trace first), then those in host memory.
// The optimizer steps each master piece where it lives (CPU Adam for host chunks, device kernels for
// device chunks). On a CPU-only machine both tiers are host memory and the fast budget is enforced by
// the ledger's accounting, so the same decisions are made and tested here.
//
// A released chunk frees its storage in place (the parameters and any views autograd saved share it),
// so a tensor saved for backward takes no memory until pre_backward gathers its chunk again.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/memory/chunked_masters.h"
#include "core/memory/eviction.h"
#include "core/memory/memory_meter.h"
#include "core/memory/tensor_state.h"
#include "core/memory/tier_ledger.h"
#include "core/hooks/block_hooks.h"
#include "core/util/device.h"

namespace kuafu::memory {

struct PlacementOptions {
  bool auto_policy = false;             // memory.placement = "auto" (else "static")
  double offload_param_fraction = 0.0;  // static: share of the compute shards (by bytes) kept in host memory
  double offload_optim_fraction = 0.0;  // static: share of the master chunks kept in host memory
  double margin_ratio = 0.0;            // auto: share of the device room spare after warm-up given to masters
  TierBudgets budgets;                  // 0: unlimited
};

struct GeminiOptions {
  int64_t chunk_numel = 0;               // elements per chunk; 0: search
  torch::Dtype dtype = torch::kFloat32;  // the model's compute dtype (masters stay float32)
  PlacementOptions placement;
  optim::GradReduce grad_reduce = optim::GradReduce::kFloat32;  // precision.grad_reduce
  DeferredWeights deferred = {};  // how trainable parameters left on the meta device get their values
  // memory.disk_dir: the master chunks (masters, gradient shard, optimizer state) the host budget cannot
  // hold live in files there, stepped a chunk at a time as they stream through host memory.
  std::optional<DiskTierOptions> disk = std::nullopt;
  int optimizer_slots = 0;        // the optimizer's state tensors per element (sizes the disk tier's records)
  int64_t chunk_search_max = 0;   // chunk_numel 0: the largest chunk the search may choose (0: its own bound)
};

class Gemini : public ChunkedMasters, public hooks::BlockHooks {
 public:
  // Broadcasts rank 0's weights, moves the trainable parameters into chunks, places the shards and
  // masters on their tiers and releases every chunk it need not keep. The model must then run its blocks
  // through run_block with this object as hooks: a parameter read outside a block sees a released chunk.
  // The model's parameters must be on the compute device.
  Gemini(torch::nn::Module& model, dist::GroupPtr group, const GeminiOptions& options);
  ~Gemini() override;

  // Gradients are reduce-scattered during every backward (accumulation adds into the shards).
  void begin_backward(bool sync) override;
  void finish_backward() override;
  // A pipeline step: each micro-batch's backward pass was reduced at its end (end_backward_pass), so
  // this only settles the step as finish_backward does.
  void reduce_accumulated() override { finish_backward(); }
  void zero_grad() override;
  // Masters into the compute-dtype shards (and chunks kept on the device); those of chunks on the disk
  // tier took theirs as their step streamed through (master_stepped).
  void copy_masters_to_model() override;
  void account_optimizer_state(int slots) override;
  std::string describe() const override;
  std::vector<std::pair<std::string, double>> memory_figures() const override;

  void pre_forward(const hooks::BlockCall& call) override;
  void post_forward(const hooks::BlockCall& call) override;
  void pre_backward(const hooks::BlockCall& call) override;
  void post_backward(const hooks::BlockCall& call) override;
  // The pass's owed reductions now: the next pass (forwards run in between) may reach the same chunks.
  void end_backward_pass() override;

  TensorState state(int64_t tensor) const { return states_.at(tensor); }
  bool gathered(int64_t chunk) const { return gathered_.at(chunk); }
  // Bytes of whole chunks gathered now, and the most at any moment so far.
  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  const TierLedger& ledger() const { return ledger_; }
  // Bytes of model data held on the fast tier, counted from the tensors themselves (to check the ledger).
  int64_t fast_bytes_held() const;
  Tier shard_tier(int64_t chunk) const { return shard_tier_.at(chunk); }
  Tier master_tier(int64_t chunk) const { return master_tier_.at(chunk); }
  int64_t evictions() const { return evictions_; }
  int64_t prefetches() const { return prefetches_; }
  bool warmed_up() const { return warmed_up_; }

 private:
  // ZeRO-3 mechanics (gemini.cpp).
  void set_compute_weights(int64_t i, const torch::Tensor& full) override;
  void master_stepped(int64_t c) override;  // chunk c's compute copy (and gathered payload) takes its masters
  const std::vector<int64_t>& tensors_of(const hooks::BlockCall& call);
  std::vector<int64_t> chunks_of(const hooks::BlockCall& call);
  void move(int64_t tensor, TensorState to);
  void gather_for_compute(const hooks::BlockCall& call, bool backward);
  void gather(int64_t chunk);
  void fill_payload(int64_t chunk);
  void release(int64_t chunk);
  void release_if_idle(int64_t chunk);
  bool idle(int64_t chunk) const;
  void on_grad_ready(int64_t tensor) override;
  torch::Tensor& staging_for(int64_t chunk);  // the chunk's gradient buffer, allocated (and accounted) on first use
  void reduce_if_complete(int64_t chunk);
  void settle(int64_t tensor);  // walks a tensor to HOLD after a backward by legal steps
  void reduce_owed();           // the reductions a finished backward pass still owes
  void settle_backward();       // reduce_owed, and the backward (and warm-up trace) ends

  // Placement (gemini_placement.cpp).
  void place_initially();
  torch::Device tier_device(Tier tier) const;
  torch::Tensor copy_to_tier(const torch::Tensor& t, Tier tier) const;
  bool tracks_memory() const;  // a fast budget or the auto policy: non-model memory is traced
  bool keeps_chunks() const;   // auto after warm-up: chunks stay gathered, evicted or prefetched by the trace
  int64_t payload_bytes(int64_t chunk) const;
  int64_t shard_bytes(int64_t chunk) const;
  int64_t master_bytes(int64_t chunk) const;  // masters, gradient shard and optimizer state
  // Host memory the disk tier's streaming may hold at once, for chunks up to the largest (0 without the tier).
  int64_t disk_staging_bytes() const;
  // Frees device room for `bytes` more (evicting idle chunks, furthest next use first, never those in
  // `keep`); the ledger then refuses what still does not fit.
  void make_room(int64_t bytes, const std::vector<int64_t>& keep);
  void begin_call(const hooks::BlockCall& call, bool backward, const std::vector<int64_t>& chunks);
  void end_call();
  void sample_non_model();
  int64_t measured_non_model();  // warm-up: this rank's measurement, the largest over the ranks
  int64_t model_bytes_in_use_counts() const;  // the model data the device's bytes in use include
  void finish_warm_up();
  void place_masters_in_margin();
  void prefetch_next_call();
  void take_arrival(int64_t chunk);  // a prefetched chunk is about to be used on the current stream
  void move_masters(int64_t chunk, Tier to);
  // The chunks whose masters are on the disk tier, the latest used in the warm-up trace first.
  std::vector<int64_t> disk_chunks_by_last_use() const;
  void take_masters_off_disk(int64_t chunk, Tier to);

  PlacementOptions placement_;
  torch::Device fast_device_;
  std::vector<torch::Tensor> payloads_;       // [chunk] whole chunk on the fast tier; storage freed when released
  std::vector<torch::Tensor> shards_;         // [chunk] this rank's shard in the compute dtype, on shard_tier_
  std::vector<bool> pinned_;                  // [chunk] one rank and a fast shard: the payload is the shard
  std::vector<Tier> shard_tier_;
  std::vector<Tier> master_tier_;
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

  TierLedger ledger_;
  int optimizer_slots_ = 0;
  bool state_counted_ = false;  // optimizer_slots_ came with the options (a disk tier sizes its records by it)
  int64_t evictions_ = 0;
  int64_t prefetches_ = 0;
  // The warm-up trace: one micro-step's block calls ("name/fwd", "name/bwd"), the chunks each uses and
  // the most non-model memory seen around it.
  bool warmed_up_ = false;
  bool tracing_ = false;
  int64_t micro_steps_seen_ = 0;
  std::optional<int64_t> non_model_base_;   // in-use minus model bytes when the trace began
  // Warm-up: the peak in use while a block computes (its temporaries), and the model bytes when it
  // began computing (set from its chunks' gathering to its post-hook).
  std::unique_ptr<PeakInUse> compute_peak_;
  std::optional<int64_t> compute_model_bytes_;
  std::vector<std::string> call_keys_;
  std::vector<std::vector<int64_t>> call_chunks_;
  std::vector<int64_t> call_non_model_;
  std::vector<int64_t> call_start_;         // [call] its first position in trace_
  AccessTrace trace_;
  int64_t call_ = -1;                       // the call running now (index into the trace), -1: unknown
  std::vector<int64_t> in_use_chunks_;      // the chunks of the block computing now: never evicted
  SideStream prefetch_stream_;              // where prefetches run (CUDA), overlapping the compute
  std::vector<std::shared_ptr<SideStreamMark>> arriving_;  // [chunk] prefetched, not yet used
  int64_t next_call_ = 0;                   // where the next call is expected
};

}  // namespace kuafu::memory

// What ZeRO and Gemini share: the model's trainable parameters laid into chunks, each chunk sharded over
// the data group, rank r keeping float32 masters (and gradients) for shard r of every chunk; the
// optimizer's view of them (one piece per parameter and rank); and where each piece lies in its
// parameter, so that every rank checkpoints its own pieces and a run saved on P ranks loads on any other
// number (core/train/checkpoint_shards.h). The trainer drives a strategy through this class.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dist/collectives.h"
#include "core/io/safetensors.h"
#include "core/memory/chunk_layout.h"
#include "core/memory/disk_masters.h"
#include "core/optim/mixed_precision.h"
#include "core/optim/optimizer.h"
#include "core/util/weight_sink.h"

namespace kuafu::memory {

class ChunkedMasters {
 public:
  virtual ~ChunkedMasters();
  ChunkedMasters(const ChunkedMasters&) = delete;
  ChunkedMasters& operator=(const ChunkedMasters&) = delete;

  // What the optimizer steps: this rank's piece of every trainable parameter, under the parameter's
  // name, as a 1-D view of its master shard (empty where the rank holds none of it); after
  // finish_backward its .grad is the gradient averaged over the group. shard_group is the data group,
  // so per-parameter norms (LAMB, LARS) and the global norm add the pieces of every rank.
  const std::vector<optim::Param>& params() const { return pieces_; }
  const ChunkLayout& layout() const { return *layout_; }
  const dist::GroupPtr& group() const { return group_; }

  // As DataParallel: before each micro-step's backward (`sync` false: a gradient-accumulation step) and
  // after the last one.
  virtual void begin_backward(bool sync) = 0;
  virtual void finish_backward() = 0;
  // A pipeline step, whose micro-batches interleave their backwards: gradients accumulate through all of
  // them (begin_backward(false) first) and are reduced here, once. Strategies that reduce inside each
  // backward (Gemini) refuse.
  virtual void reduce_accumulated();
  virtual void zero_grad() = 0;
  // The updated master shards into the model's weights.
  virtual void copy_masters_to_model() = 0;
  // One line for the log: strategy, chunks, ranks.
  virtual std::string describe() const = 0;
  // The optimizer keeps `slots` state tensors per master element (for strategies that budget memory).
  virtual void account_optimizer_state(int /*slots*/) {}
  // Memory figures for the metrics line and benchmarks (e.g. peak bytes per tier), in MiB or counts.
  virtual std::vector<std::pair<std::string, double>> memory_figures() const { return {}; }

  // Collective: optimizer state_tensors() of pieces gathered into whole "<param>/<slot>" tensors.
  io::NamedTensors full_state(const io::NamedTensors& piece_state) const;
  // What a checkpoint loads into: for every chunked parameter a float32 tensor of its shape on the meta
  // device (a shape, no memory; load_weight takes its values), and the model's other parameters and
  // buffers themselves (loaded in place). No communication.
  io::NamedTensors weights_to_load() const;
  // Parameter `name`'s whole saved values into this rank's master piece and the model's compute copy (its
  // chunk opened when it lives on the disk tier: close_disk_chunk after the last).
  void load_weight(const std::string& name, const torch::Tensor& full);
  // For sharded checkpoints (no communication): where this rank's piece of parameter `name` starts among
  // the parameter's elements and how many it holds, its shape, and whether `name` is chunked at all.
  int64_t piece_offset(const std::string& name) const;
  int64_t piece_numel(const std::string& name) const;
  const std::vector<int64_t>& shape_of(const std::string& name) const { return shapes_.at(index_of(name)); }
  bool chunked(const std::string& name) const;
  // A whole saved tensor of parameter `name` (e.g. its optimizer state) cut to this rank's piece.
  torch::Tensor piece_of(const std::string& name, const torch::Tensor& full) const;
  // Collective over the data group, then `copies`: after finish_backward, parameter `name`'s averaged
  // gradient plus those of its copies on the ranks of `copies` (a tied weight on other pipeline stages),
  // each copy sharded over its own data group. The pieces lie at other offsets in the copies' chunks, so
  // the whole gradient is assembled first.
  void sum_gradient_with_copies(const std::string& name, const dist::ProcessGroup& copies);

  // Master chunks on the disk tier (disk_masters.h): their pieces' tensors, gradients and optimizer state
  // hold no memory except while streamed through; a step then goes through step_masters_on_disk.
  bool masters_on_disk() const { return disk_ && !disk_->empty(); }
  bool piece_on_disk(size_t piece) const;
  // [piece] squared_norm() of each disk piece's gradient, taken when its chunk's reduced gradient was
  // last added (undefined for pieces in memory and before any): the global norm without reading them back.
  std::vector<torch::Tensor> known_grad_squares() const;
  // The optimizer state the disk tier's records hold, by parameter name (Optimizer::set_state), one
  // tensor per slot.
  std::vector<std::pair<std::string, std::vector<torch::Tensor>>> optimizer_state_homes() const;
  // For each chunk on the disk in order, with its masters, gradient and optimizer state in memory:
  // `step(pieces)` (indices into params()) updates them, the chunk's compute copy takes the new masters
  // (master_stepped), and the record is written back. Collective when master_stepped is (gathered chunks).
  void step_masters_on_disk(const std::function<void(const std::vector<size_t>& pieces)>& step);
  // For each chunk on the disk in order, with its masters and the record's slots (optimizer state, then the
  // moving average's) in memory and no gradient: `body(pieces)`; with `changed` the record is written back,
  // and with `masters_changed` the chunk's compute copy takes its masters too (collective as above).
  void visit_masters_on_disk(bool changed, bool masters_changed,
                             const std::function<void(const std::vector<size_t>& pieces)>& body);
  // Checkpoints of master chunks on the disk tier, one chunk in host memory at a time: open_disk_chunk_of
  // brings the record holding `t` (a piece, its optimizer state) or parameter `name`'s, closing the one
  // open before (written back when `will_change` was said of it); nothing for tensors in memory.
  // close_disk_chunk after the last.
  void open_disk_chunk_of(const torch::Tensor& t, bool will_change);
  void open_disk_chunk_of(const std::string& name, bool will_change);
  void close_disk_chunk();

 protected:
  // Lays the model's trainable parameters out in chunks in the order of `names` and broadcasts rank 0's
  // weights and buffers. chunk_numel 0: search_chunk_numel up to kMaxChunkBytes of `dtype` (and up to
  // search_max_numel elements when that is set). Gradients
  // are reduced over the group in optim::grad_dtype(dtype, grad_reduce). Trainable parameters still on
  // the meta device (lazy construction) take their values from `deferred` in build_masters; every rank
  // draws and loads the same values, so they are not broadcast.
  ChunkedMasters(torch::nn::Module& model, dist::GroupPtr group, std::vector<std::string> names,
                 int64_t chunk_numel, torch::Dtype dtype, optim::GradReduce grad_reduce, DeferredWeights deferred,
                 int64_t search_max_numel = 0);
  // Builds the master shards: `keep(c, whole)` gets chunk c whole, in the parameters' own precision, and
  // returns this rank's master shard (a copy, or a view the strategy keeps alive) after pointing the
  // chunk's parameters into its compute copy (bind); then the pieces. Chunks are made one at a time as
  // their parameters' values arrive (deferred ones from `deferred.initialize`, in any order), so besides
  // what the strategy keeps only the chunks being filled exist whole.
  void build_masters(const std::function<torch::Tensor(int64_t chunk, const torch::Tensor& whole)>& keep);
  // Points parameter i at `values` (its place in a chunk's compute copy), from the meta device too.
  void bind(int64_t i, const torch::Tensor& values);
  // Master chunks may go to the disk tier, each as a record of `slots` optimizer state tensors besides
  // its master (before build_masters).
  void use_disk_tier(DiskTierOptions options, int slots);
  // In build_masters' `keep`: chunk c's master shard made a record on the disk tier from `master` (this
  // rank's float32 shard); returns the master's place in it. The chunk goes to the disk once built.
  torch::Tensor make_disk_record(int64_t c, const torch::Tensor& master);
  bool chunk_on_disk(int64_t c) const { return disk_ && disk_->holds(c); }
  // Chunk c's masters, gradient and optimizer state leave the disk tier for host memory, where the views
  // the optimizer holds of them stay valid (relocate_masters may then move them on).
  void take_off_disk(int64_t c);
  // Chunk c's masters were just stepped in the disk tier's stream: its compute copy takes them.
  virtual void master_stepped(int64_t /*c*/) {}
  // zero_grad of the chunks on the disk tier.
  void zero_disk_grads();
  // Moves chunk c's master and gradient shards to `device` (a copy even on the same device) and points
  // the optimizer's pieces at them; the optimizer state follows at its next step.
  void relocate_masters(int64_t chunk, const torch::Device& device, bool pinned);
  // Writes whole values of tensor `i` into the strategy's compute copy (after a checkpoint load).
  virtual void set_compute_weights(int64_t i, const torch::Tensor& full) = 0;
  // Called each time autograd has accumulated a backward's gradient into parameter `i` (after
  // watch_gradients(), which the strategy calls once its parameters are in place).
  virtual void on_grad_ready(int64_t i) = 0;
  void watch_gradients();
  // step_masters_on_disk and visit_masters_on_disk: DiskMasters::for_each over the chunks on the disk.
  void each_chunk_on_disk(bool gradients, bool changed, bool masters_changed,
                          const std::function<void(const std::vector<size_t>& pieces)>& body);
  // Zeros for a whole chunk `c` in the compute dtype, e.g. for its gradients.
  torch::Tensor zero_chunk(int64_t c) const;
  // Copies parameter i's .grad into its place in `staging` (a zero_chunk made when undefined) and drops it.
  // Each place is written once per backward, so staging in the compute dtype rounds nothing.
  void move_grad_to_staging(int64_t i, torch::Tensor& staging);
  // A gradient average over the group is for_reduction, a reduce-scatter, then add_reduced_grads.
  // for_reduction gives whole-chunk gradients as the reduce-scatter should sum them: widened to float32
  // (exact; a transient copy, as the collective's own buffers are) unless they are float32 already, or,
  // with grad_reduce = compute, in the compute dtype divided by the group size first (in place).
  // add_reduced_grads adds chunk c's reduced shard into its float32 gradient shard, divided by the group
  // size where for_reduction did not.
  torch::Tensor for_reduction(torch::Tensor& chunk_grads) const;
  void add_reduced_grads(int64_t c, const torch::Tensor& reduced);
  int64_t index_of(const std::string& name) const;

  torch::nn::Module& model_;
  dist::GroupPtr group_;
  int rank_;
  torch::Dtype dtype_;                        // the compute dtype
  torch::Dtype grad_dtype_;                   // reductions (and ZeRO-1's accumulation): float32 under bf16/fp16
  torch::Dtype master_dtype_;                 // float32 (float64 for float64 models)
  torch::Device device_;                      // where the model computes
  DeferredWeights deferred_;                  // how meta parameters get their values (lazy construction)
  std::vector<std::string> names_;            // trainable parameters in layout order
  std::vector<torch::Tensor> params_;         // the model's parameters, same order
  std::vector<std::vector<int64_t>> shapes_;  // their shapes
  std::optional<ChunkLayout> layout_;
  std::vector<torch::Tensor> master_shards_;  // [chunk] this rank's shard
  std::vector<torch::Tensor> grad_shards_;    // [chunk] its averaged gradient
  std::vector<optim::Param> pieces_;          // registration order
  std::vector<int64_t> piece_of_tensor_;      // [tensor] its index in pieces_
  std::vector<int64_t> chunk_of_piece_;       // [piece] the chunk it lies in
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keep the gradient hooks alive
  std::unique_ptr<DiskMasters> disk_;          // master chunks on the disk tier, or null
  int disk_slots_ = 0;                         // optimizer state tensors in each disk record
  std::vector<torch::Tensor> disk_records_;    // [chunk] [(1 + slots) * shard] float32, for chunks on the disk
  std::vector<torch::Tensor> grad_squares_;    // [tensor] known squared gradient norms of disk pieces
  std::vector<std::vector<torch::Tensor>> disk_state_;  // [tensor] its optimizer slots' places in its disk record
  int64_t open_chunk_ = -1;                    // the disk chunk a checkpoint holds in memory, or -1
  bool open_changed_ = false;                  // ... and whether it is to be written back
  void open_disk_chunk(int64_t c, bool will_change);
};

// Upper end of the chunk-size search, in bytes of the compute dtype, and the fewest chunks it aims for.
constexpr int64_t kMaxChunkBytes = 64 << 20;
constexpr int64_t kMinChunks = 8;

using optim::low_precision;

// A copy of `t` on `device` (in page-locked memory when `pinned`, for fast copies to a GPU).
torch::Tensor copy_to(const torch::Tensor& t, const torch::Device& device, bool pinned);

// The model's trainable parameters, in registration order.
std::vector<std::string> trainable_names(const torch::nn::Module& model);

}  // namespace kuafu::memory

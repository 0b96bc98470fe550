// One trained model's optimisation state, whatever the memory strategy: its float32 masters (plain
// replicas whose gradients data parallelism averages in buckets, or ZeRO-1/2/Gemini chunks sharded over
// the replicas), its optimizer, learning-rate schedule and loss scaler. A training loop drives one
// ModelState per trained model through each step:
//
//   lr = state.start_step(step)
//   for each micro-step: state.begin_backward(last); (loss * state.loss_scale() / micro_steps).backward();
//   state.end_backward();
//   norm = state.grad_norm();                  // collective: agree on overflow across models and ranks
//   state.finish_step(norm, overflow);         // clip, step (or skip), scaler update, zero gradients
//
// and saves or resumes it through checkpoint_tensors() / load().
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/config/config.h"
#include "core/hooks/block_hooks.h"
#include "core/io/safetensors.h"
#include "core/memory/chunked_masters.h"
#include "core/optim/loss_scaler.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/mixed_precision.h"
#include "core/parallel/data/data_parallel.h"
#include "core/train/checkpoint.h"
#include "core/train/runtime.h"
#include "core/train/tied_copies.h"
#include "core/util/weight_sink.h"

namespace kuafu::memory {
class FrozenWeightOffload;  // core/memory/frozen_offload.h
}  // namespace kuafu::memory

namespace kuafu::train {

// optim.ema_warmup and its settings: how the moving average's decay rises with its updates.
struct EmaWarmup {
  std::string kind = "none";  // "none", "diffusers" ((1 + s) / (10 + s)) or "power" (1 − (1 + s / inv_gamma)^−power)
  double inv_gamma = 1.0, power = 2.0 / 3.0;
};

struct ModelStateOptions {
  std::string name;   // its part of a checkpoint of several models ("" for an app's one model)
  int64_t steps = 1;  // optimizer steps of the run: the schedule's length
  // Parameters with copies on other ranks (a pipeline's tied embedding): after a pipelined backward each
  // gets the sum of the copies' gradients; only counted copies enter the global norm and checkpoints.
  TiedCopies tied;
  // Installs (null: removes) hooks around each of the model's blocks; false when the model does not run
  // its blocks through the block-call interface. Null: it cannot. Gemini needs it.
  std::function<bool(hooks::BlockHooks*)> set_block_hooks;
  // A model whose trainable parameters are still on the meta device (lazy construction, under
  // memory.strategy zero1, zero2 or gemini): how they get their values, streamed into the chunks.
  DeferredWeights deferred;
};

// The checkpoint part holding model `name`'s moving average of its trained weights ("" names an app's one model).
inline std::string ema_part_of(const std::string& name) { return name.empty() ? "ema" : name + ".ema"; }

class ModelState {
 public:
  // Reads optim.*, precision.* and memory.* from `config`. The model's parameters must already be on
  // runtime.device, or (trainable ones, with options.deferred) on the meta device.
  ModelState(const config::Config& config, const Runtime& runtime, torch::nn::Module& model, ModelStateOptions options);
  ~ModelState();
  ModelState(const ModelState&) = delete;
  ModelState& operator=(const ModelState&) = delete;

  // Sets and returns step `step`'s learning rate.
  double start_step(int64_t step);
  double learning_rate(int64_t step) const { return schedule_->lr(step); }
  // What each micro-step's loss is multiplied by before backward (fp16 loss scaling; 1 otherwise).
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }

  // Before each micro-step's backward; `last`: the step's last, whose backward reduces the gradients.
  void begin_backward(bool last);
  // After the last micro-step's backward: every reduction has ended.
  void end_backward();
  // A pipeline schedule interleaves the micro-steps' backwards: the reduction comes after all of them.
  void begin_pipelined_backward();
  void end_pipelined_backward();  // reduces, then sums the tied copies' gradients
  // A stop between micro-steps: the gradients are settled as a step's would be (the same collectives on
  // every rank), then dropped.
  void drop_partial_step();

  // The unscaled global gradient norm, over every rank holding part of the model (collective).
  double grad_norm();
  // Unscales and clips the gradients to `max_norm` (0: no clipping) and steps, unless `overflow`; then
  // updates the loss scaler and zeroes the gradients.
  void finish_step(double grad_norm, double max_norm, bool overflow);
  // The norm this model's gradients are clipped to (optim.grad_clip; 0: none).
  double grad_clip() const;

  // The step as a CUDA graph replays it (benchmark.cuda_graphs), nothing read on the host:
  //   state.start_step(step); state.prepare_device_step()   // outside the graph: the learning rate, the count
  //   [captured] begin_backward(true); loss.backward(); end_backward(); norm = finish_step_on_device(max_norm)
  //   after the replay, if norm is not finite: state.take_back_device_step()
  // Why this model's step cannot (a sentence), or nullopt when it can: plain replicas on one process, no loss
  // scaler, no moving average, no frozen weights offloaded, an optimizer with a step on the device (AdamW).
  std::optional<std::string> device_step_refusal() const;
  void prepare_device_step();
  // Norm, clipping and update (none where the gradients are not finite), the compute copies, the gradients
  // zeroed: finish_step()'s work. Returns the unclipped global norm, [1] float64 on the device.
  torch::Tensor finish_step_on_device(double max_norm);
  void take_back_device_step() { optimizer_->unprepare_device_step(); }

  // This model's parts of a checkpoint: its weights and optimizer state, and its moving average when
  // optim.ema_decay is set; each rank's pieces as it holds them (its ZeRO/Gemini piece, its tensor-parallel
  // block, its pipeline stage), each tensor written by one rank only. No communication.
  std::vector<CheckpointPart> checkpoint_parts() const;
  // Adds the loss scaler's state and the moving average's count of updates to a checkpoint's trainer state.
  void save_scaler_state(nlohmann::json& trainer_state) const;
  // Restores weights, optimizer state and this rank's RNG from this model's part of `folder`, and the
  // loss scaler and the average's count from `trainer_state`; kuafu::Error naming the folder on any mismatch.
  void load(const std::string& folder, const nlohmann::json& trainer_state);

  optim::Optimizer& optimizer() { return *optimizer_; }
  const optim::DynamicLossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  torch::Dtype compute_dtype() const { return dtype_; }
  // The moving average of the float32 weights (this rank's pieces, as the optimizer's parameters), and
  // whole tensors of it by name (collective); empty without optim.ema_decay.
  const std::vector<torch::Tensor>& ema() const { return ema_; }
  io::NamedTensors full_ema() const;
  // Exchanges the moving average with the weights the optimizer steps and gives the model the result, as
  // a step does: the model then computes with the average. A second call restores everything bit for bit.
  // Nothing without optim.ema_decay. Collective under ZeRO and Gemini.
  void swap_ema();
  // Gemini's and ZeRO's memory figures for the metrics line (empty for plain replicas).
  std::vector<std::pair<std::string, double>> memory_figures() const;

 private:
  void init_replicated(const dist::GroupPtr& replicas);
  // Which parameters count in the global norm: a block replicated over the tensor group on one rank of it.
  void mark_tensor_parallel_params();
  // Each tied copy's gradient becomes the sum of the copies' (after the data-parallel reduction).
  void sum_tied_gradients();
  void offload_frozen_weights();  // memory.offload_frozen
  // `weights` with a frozen base on the disk tier (memory.disk_dir) as host copies read from its files, for a
  // checkpoint to be written from or loaded into; unchanged otherwise.
  io::NamedTensors with_frozen_values(io::NamedTensors weights) const;
  // model.init_from's weights into the chunks of a lazily built model (options.deferred.load).
  void load_deferred_weights();
  void zero_grads();
  // Master chunks on Gemini's disk tier: the step goes a chunk at a time (`factor` unscales and clips).
  bool streams_masters() const;
  void step_streamed(double factor, double ema_decay);
  parallel::Layout layout_of(const std::string& name) const;  // empty for whole tensors
  std::string scaler_key() const { return options_.name.empty() ? "loss_scaler" : options_.name + ".loss_scaler"; }
  std::string ema_updates_key() const { return options_.name.empty() ? "ema_updates" : options_.name + ".ema_updates"; }
  std::string ema_part() const { return ema_part_of(options_.name); }
  double next_ema_decay();                 // the decay of the next update of the moving average (counts it)
  void average_piece(size_t i, double decay);  // params_[i]'s moving average takes its weights
  void update_ema(double decay);           // every piece's but those on the disk tier (step_streamed's)
  // Whole tensors of the model's layout (tensor-parallel blocks gathered, pipeline stages collected on
  // rank 0), by parameter name or "<param>/<slot>" for optimizer state.
  io::NamedTensors whole(io::NamedTensors tensors) const;
  // This rank's pieces of `tensors` (by parameter or buffer name, or "<param>/<slot>" optimizer state)
  // that it writes in a checkpoint: of the ranks holding the same piece (data replicas, replicas over a
  // tensor axis, a tied weight's second stage) only one does, and an optimizer-wide entry ("step") only
  // world rank 0 writes.
  std::vector<TensorPiece> owned_pieces(const io::NamedTensors& tensors) const;
  // Where elements from `offset` of this rank's block (shape `block`) of tensor `name` lie in the whole.
  PiecePlace place_in_whole(const std::string& name, std::vector<int64_t> block, int64_t offset) const;

  const config::Config& config_;
  const Runtime& runtime_;
  torch::nn::Module& model_;
  ModelStateOptions options_;
  torch::Dtype dtype_ = torch::kFloat32;
  std::unique_ptr<optim::MasterWeights> masters_;
  std::unique_ptr<parallel::DataParallel> data_parallel_;
  std::unique_ptr<memory::ChunkedMasters> sharded_;  // zero1 / zero2 / gemini: replaces masters_ and data_parallel_
  std::unique_ptr<memory::FrozenWeightOffload> frozen_offload_;  // memory.offload_frozen
  std::vector<optim::Param> params_;                 // the masters, with their tensor-parallel sharding
  std::map<std::string, parallel::Layout> layouts_;  // tensor-parallel parameters by name
  dist::GroupPtr norm_group_;                        // ranks whose gradients make up one global norm
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::optional<optim::DynamicLossScaler> scaler_;
  double ema_decay_ = 0;
  EmaWarmup ema_warmup_;             // optim.ema_warmup: how the decay rises with the updates
  int64_t ema_updates_ = 0;          // updates taken (the warm-up's step), saved in the trainer state
  std::vector<torch::Tensor> ema_;  // parallel to params_
  bool hooks_installed_ = false;
};

}  // namespace kuafu::train

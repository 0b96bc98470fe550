// The optimizer interface: parameter groups with their own options, per-parameter state kept under
// the parameter's name (so checkpoints are readable and survive re-sharding), exact save/load.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dist/process_group.h"
#include "core/io/safetensors.h"

namespace kuafu::optim {

// One trainable tensor as the optimizer sees it.
struct Param {
  std::string name;     // Hugging Face name; the key of its optimizer state
  torch::Tensor tensor;  // the parameter, or this rank's shard of it; updated in place from .grad()
  // Ranks that hold disjoint pieces of the full parameter (tensor parallel, ZeRO); null = whole here.
  // Per-parameter norms (LAMB, LARS) are summed over this group so the sharded step equals the unsharded one.
  dist::GroupPtr shard_group;
  // False on a replica that another rank of the global-norm group already counts (e.g. a layer norm
  // copied on every tensor-parallel rank), so that nothing is counted twice in the global norm.
  bool counts_in_global_norm = true;
};

struct GroupOptions {
  double lr_scale = 1.0;       // the group's learning rate is the schedule's times this
  double weight_decay = 0.0;
  bool trust_scaling = true;   // LAMB / LARS layer-wise adaptation; off for biases and norm gains
};

struct ParamGroup {
  std::string name;
  std::vector<Param> params;
  GroupOptions options;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update from every parameter's current .grad() times `grad_factor` (clipping and unscaling in one
  // number; a parameter without a gradient is left alone). Kernels that take the factor read each gradient
  // once (AdamW's); for the others the gradients are multiplied first. Either way the same bits.
  void step(double grad_factor = 1.0);
  // The same step in parts, for masters that pass through memory a chunk at a time (Gemini's disk tier):
  // begin_step() once, then update() for each part; together they equal step(). Each part updates the
  // parameters `selected` names (by Param::name); every rank must update the same parts in the same order
  // (LAMB and LARS sum each part's norms over the ranks).
  void begin_step();
  void update(const std::function<bool(const std::string& name)>& selected);
  void zero_grad();
  // Makes `slots` (the parameter's shape and state dtype, one per slot_names() entry, zeros before the
  // first step) parameter `name`'s state: memory the caller places, e.g. in a chunk's file on the disk tier.
  void set_state(const std::string& name, std::vector<torch::Tensor> slots);

  // The step as a CUDA graph captures it, nothing read on the host (can_step_on_device(): AdamW and Adam).
  // prepare_device_step() runs before each step, outside the graph: it counts the step and writes each
  // group's learning rate and the step count into tensors on the parameters' device, which the kernels read
  // as they run. step_on_device() is the captured part: each gradient times `grad_factor` ([] float32:
  // clipping and unscaling), then the update, which changes nothing where `skip` ([] float32) is 1
  // (non-finite gradients: the caller then takes the step back with unprepare_device_step()). The first
  // run creates the state (zeros), so it must not be the captured one. On CUDA the same bits as step().
  bool can_step_on_device() const { return updates_on_device(); }
  void prepare_device_step();
  void step_on_device(const torch::Tensor& grad_factor, const torch::Tensor& skip);
  void unprepare_device_step() { --steps_; }

  void set_lr(double lr) { lr_ = lr; }  // the base rate; group g uses lr * g.lr_scale
  double lr() const { return lr_; }
  int64_t steps_taken() const { return steps_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  virtual std::string name() const = 0;
  // State tensors kept per parameter (Adam: 2), each the parameter's size, for memory planning.
  int state_slots() const { return static_cast<int>(slot_names().size()); }

  // The state as named tensors "<param name>/<slot>" plus "step": everything an exact resume needs.
  io::NamedTensors state_tensors() const;
  // Restores state_tensors() output; `where` names the source in errors. Checks names, shapes, algorithm.
  // `part`: this rank holds part of the model (a pipeline stage), so `saved` may hold other parameters' state.
  void load_state_tensors(const io::SafetensorsFile& saved, const std::string& where, bool part = false);
  // The same from tensors read one at a time when asked (a checkpoint streams them), each copied into the
  // state tensor already there when there is one: loading holds at most one saved tensor beside the state.
  // A failure part way leaves the state partly loaded (a run stops on it).
  struct SavedState {
    std::map<std::string, std::string> metadata;
    size_t count = 0;  // state tensors saved (that this rank may read)
    std::function<std::optional<torch::Tensor>(const std::string& name)> read;  // none when not saved
  };
  void load_state_tensors(const SavedState& saved, const std::string& where, bool part = false);

 protected:
  // Called once per step, after the step counter is incremented and before any group is updated.
  virtual void before_update() {}
  // Whether update_group applies grad_factor() itself; if not, step() multiplies the gradients first.
  virtual bool takes_grad_factor() const { return false; }
  // What this step's gradients are to be multiplied by (1 outside step() and where not taken).
  double grad_factor() const { return grad_factor_; }
  // Names of the per-parameter state tensors (e.g. exp_avg, exp_avg_sq); created as zeros, float32
  // (float64 for float64 parameters).
  virtual std::vector<std::string> slot_names() const = 0;
  // Applies one update to `group`; `states[i]` holds params[i]'s slots. steps_taken() is already
  // incremented (1 on the first step).
  virtual void update_group(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states) = 0;
  // What step_on_device() gives each group: tensors on the parameters' device, [] float32.
  struct DeviceScalars {
    torch::Tensor lr;           // the group's learning rate
    torch::Tensor step;         // steps_taken(), 1 on the first step
    torch::Tensor grad_factor;  // what the gradients are multiplied by first
    torch::Tensor skip;         // 1: leave the parameters and state unchanged
  };
  virtual bool updates_on_device() const { return false; }
  virtual void update_group_on_device(ParamGroup& group, std::vector<std::vector<torch::Tensor>>& states,
                                      const DeviceScalars& scalars);

 private:
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<std::vector<torch::Tensor>>> states_;  // [group][param][slot]
  // Creates params[i]'s state of group g (zeros) where it has none, and keeps it on the parameter's device.
  void ensure_state(size_t g, size_t i);
  std::vector<torch::Tensor> device_lrs_;  // [group] [] float32: prepare_device_step()'s learning rates
  torch::Tensor device_step_;              // [] float32: its step count
  double lr_ = 0.0;
  int64_t steps_ = 0;
  double grad_factor_ = 1.0;
};

// The parameter a state tensor of state_tensors() belongs to ("h.0.w/exp_avg" -> "h.0.w"); nullopt for
// optimizer-wide entries such as "step".
std::optional<std::string> state_owner(const std::string& state_name);

// [] float64 on t's device: the sum of the squares of t's elements (what every norm here adds up).
torch::Tensor squared_norm(const torch::Tensor& t);

// [n] float64 on the tensors' device: the sum of squares of `tensors[i]`, added over `groups[i]` (null:
// local only) with one all-reduce per distinct group. The basis of sharded per-layer and global norms.
torch::Tensor squared_norms(const std::vector<torch::Tensor>& tensors, const std::vector<dist::GroupPtr>& groups);

}  // namespace kuafu::optim

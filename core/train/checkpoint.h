// Checkpoints: one folder per step holding the model (safetensors, Hugging Face names), optimizer
// state, each rank's RNG state and the trainer state, sealed by a manifest of sizes and CRC-32s. A model
// trained over several ranks is saved sharded: each rank streams the pieces it owns to a file of its own,
// and any layout loads them back (checkpoint_shards.h).
// A folder is built under a temporary name and renamed into place, so a crash never leaves a torn one.
// A loop that trains several models (PPO's policy and value model beside frozen reference and reward
// models) saves them all in one folder as named parts: <part>.model.safetensors and, for a trained one,
// <part>.optimizer.safetensors; an app's one model is the unnamed part (model.safetensors).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dist/process_group.h"
#include "core/io/safetensors.h"
#include "core/optim/optimizer.h"
#include "core/train/checkpoint_shards.h"

namespace kuafu::train {

// One model of a checkpoint: whole tensors (rank 0's are written), or each rank's pieces (every rank
// writes its own, in parallel; see checkpoint_shards.h).
struct CheckpointPart {
  std::string name;                  // "" for an app's one model
  io::NamedTensors weights = {};          // parameters (float32 masters in mixed precision) and buffers
  io::NamedTensors optimizer_state = {};  // empty for a frozen model (no optimizer file)
  std::string optimizer_name = "";        // empty for a frozen model (no optimizer file)
  bool sharded = false;              // true: the pieces below instead of `weights` and `optimizer_state`
  std::vector<TensorPiece> weight_pieces = {};  // this rank's, of tensors no other rank writes
  std::vector<TensorPiece> state_pieces = {};
  // Pieces whose memory comes on demand (master chunks on Gemini's disk tier): called before each tensor
  // is read for writing, and once the part's files are written. Synchronous saves only.
  std::function<void(const torch::Tensor&)> before_write = nullptr;
  std::function<void()> after_write = nullptr;
};

class CheckpointStore {
 public:
  // `root` holds step_00000100/ folders and a `latest` file. Keeps the newest `keep` checkpoints.
  CheckpointStore(std::string root, dist::GroupPtr world, int keep);

  // Collective over `world`: every rank saves its RNG state and the pieces of sharded parts; rank 0 writes
  // the rest. `weights` are
  // the model's parameters (float32 masters in mixed precision) and buffers under their model names.
  void save(int64_t step, const io::NamedTensors& weights, const optim::Optimizer& optimizer,
            const nlohmann::json& trainer_state) const;
  // The same with the optimizer state given as tensors (e.g. gathered from tensor-parallel blocks).
  void save(int64_t step, const io::NamedTensors& weights, const io::NamedTensors& optimizer_state,
            const std::string& optimizer_name, const nlohmann::json& trainer_state) const;
  // Several models in one checkpoint, each a part with its own name; `rank_state` (each rank its own,
  // may be empty): the task's state (RunTask::task_state).
  void save(int64_t step, const std::vector<CheckpointPart>& parts, const nlohmann::json& trainer_state,
            const io::NamedTensors& rank_state = {}) const;

  // Asynchronous saving (train.async_save): the same checkpoint as save(), collective as save() is, but
  // each rank's files are written by a thread of its own from a copy of `parts` in host memory while
  // training goes on. The checkpoint is complete (its manifest written, renamed into place, `latest`
  // naming it) only at finish_pending(): the trainer calls that once no rank is writing (writing()
  // false on every rank), before its next save and at the end of the run. Until then `latest` names
  // the previous checkpoint. A write that failed fails finish_pending() on every rank.
  void save_async(int64_t step, const std::vector<CheckpointPart>& parts, const nlohmann::json& trainer_state,
                  const io::NamedTensors& rank_state = {});
  bool writing() const;  // this rank's writer thread is still at work
  bool pending() const { return pending_ != nullptr; }
  void finish_pending();  // collective; waits for this rank's writer first
  // Waits for a writer still running; an unfinished save stays a .partial folder, which the next run
  // removes.
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  // The checkpoint `latest` names (a step_N folder beside it; it is never followed elsewhere), or when
  // that pointer is missing the newest complete checkpoint. None when there is no checkpoint; kuafu::Error
  // for a bad pointer or step_N folders none of which is complete.
  std::optional<std::string> latest() const;
  // latest() when it is intact (its manifest's sizes and checksums hold, its trainer state reads);
  // otherwise, with a warning naming what is wrong, the newest earlier checkpoint that is. With it, its
  // trainer state (read once, verified). kuafu::Error (latest()'s own) when none is intact. Collective
  // over the store's world, whose ranks share the checksum reads (read_trainer_state).
  std::optional<std::pair<std::string, nlohmann::json>> latest_intact() const;
  // Removes the step_N.partial folders of saves that died. Only for the run holding the folder's lock:
  // nothing else may be writing one.
  void remove_unfinished_saves() const;
  // The step_N folders above `step` (left by a run this one resumed from an earlier checkpoint of).
  std::vector<std::string> later_than(int64_t step) const;

  // This rank's part of a saved tensor: a tensor-parallel block, a run of a block's elements (a
  // ZeRO/Gemini piece) or both. Only the saved bytes of it are read.
  struct LocalPart {
    PiecePlace place;            // where it lies in the whole tensor (`place.shape` the whole's)
    std::vector<int64_t> shape;  // how this rank holds its elements: the block's shape, or 1-D for a run
  };
  // A tensor's part on this rank, by the tensor's name; null (or none returned): the whole tensor.
  using PlaceOf = std::function<std::optional<LocalPart>(const std::string& name)>;

  // How this rank takes a checkpoint, which any number of ranks may have written.
  struct LoadTarget {
    int rank = 0;           // whose RNG state is restored
    PlaceOf weight_place;   // a weight's part on this rank
    PlaceOf state_place;    // a parameter's optimizer state (by the parameter's name); null: weight_place
    bool part = false;      // this rank holds part of the model (a pipeline stage): loads the tensors it has
    // Takes a loaded tensor (this rank's part of it) whose target is a meta tensor, a shape only (Gemini's
    // and ZeRO's chunked weights, stored where the strategy keeps them). Null: every target is real.
    std::function<void(const std::string& name, const torch::Tensor& local)> store;
    // Called with a parameter's name before its optimizer state is loaded into the optimizer (whose
    // state may live on Gemini's disk tier, brought in by it). Null: nothing to do.
    std::function<void(const std::string& param)> before_state;
  };

  // Verifies the manifest (sizes and checksums) and the model's names and shapes, then restores
  // model, optimizer and this rank's RNG; returns the trainer state. kuafu::Error on any mismatch.
  // A checkpoint from another number of ranks or layout loads too (each tensor's part on this rank is
  // read from the saved pieces it overlaps); the RNG then continues unrestored (warning).
  // `part` names the model in a checkpoint of several.
  static nlohmann::json load(const std::string& folder, const io::NamedTensors& weights,
                             optim::Optimizer& optimizer, const LoadTarget& target, const std::string& part = "");

  // Only the model weights (e.g. for generate / eval), verified the same way.
  static void load_model(const std::string& folder, torch::nn::Module& model, const std::string& part = "");
  // `subset`: the weights are part of the saved model (a pipeline stage's). `before_store(name)` is called
  // before a tensor is written into (targets whose memory comes on demand: Gemini's disk tier).
  static void load_weights(const std::string& folder, const io::NamedTensors& weights,
                           const PlaceOf& place_of = nullptr, const std::string& part = "", bool subset = false,
                           const std::function<void(const std::string&)>& before_store = nullptr);
  // A checkpoint's trainer state, once its manifest is verified. With `share` (collective over it) the
  // ranks split the CRC checks, each file read by one rank, and all fail alike, with the words of the
  // lowest rank that found damage.
  static nlohmann::json read_trainer_state(const std::string& folder, const dist::ProcessGroup* share = nullptr);
  // Every tensor of a part's model or optimizer state (`kind` "model" or "optimizer"), whole, whatever
  // layout wrote them (tools and tests).
  static io::NamedTensors read_whole(const std::string& folder, const std::string& kind, const std::string& part = "");
  // Rank `rank`'s task state in `folder` (empty when it holds none).
  static io::NamedTensors load_task_state(const std::string& folder, int rank);

  const std::string& root() const { return root_; }

 private:
  void prune(int64_t saved_step) const;  // drops older checkpoints beyond `keep`
  // A save's three phases: rank 0 makes the .partial folder (collective); every rank writes its files
  // into it (no communication: a writer thread may do it); rank 0 seals it with the manifest, renames
  // it into place and points `latest` at it (collective).
  std::string begin_save(int64_t step) const;
  void write_rank_files(int64_t step, const std::string& partial, const std::vector<CheckpointPart>& parts,
                        const nlohmann::json& trainer_state, const io::NamedTensors& rank_state,
                        const io::NamedTensors& generators) const;
  void seal(int64_t step) const;

  struct PendingSave;
  std::string root_;
  dist::GroupPtr world_;
  int keep_;
  std::unique_ptr<PendingSave> pending_;  // an asynchronous save not yet sealed
};

// A module's parameters and buffers under their names (the tensors themselves, not copies).
io::NamedTensors named_weights(const torch::nn::Module& model);
// Copies `weights` into `model`'s tensors of the same names; kuafu::Error naming a tensor the model
// lacks or whose shape differs, and a model tensor that `weights` leaves out.
void copy_named_weights(const io::NamedTensors& weights, torch::nn::Module& model);

// Pipeline parallelism: every stage's tensors (whole, after any tensor-parallel gather) collected on
// stage 0, which saves them; collective over `pipeline`. Other stages get `mine` back.
io::NamedTensors gather_pipeline_stages(io::NamedTensors mine, const dist::ProcessGroup& pipeline);

// Whether `mine` holds on any rank of `world` (one tiny all-reduce; none on a single rank).
bool on_any_rank(bool mine, const dist::ProcessGroup& world);

// "run/checkpoints/step_00000100" for step 100.
std::string checkpoint_folder(const std::string& root, int64_t step);

// The checkpoint an `eval`-like command reads: `requested` (a --checkpoint folder) when given, else
// the latest complete one under <out_dir>/checkpoints; throws saying how to get one when there is none.
std::string checkpoint_to_read(const std::string& out_dir, const std::string& requested);

}  // namespace kuafu::train

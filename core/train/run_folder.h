// A training run's folder (train.out_dir), the same for every training loop: one run at a time in it
// (a lock), its checkpoints (checkpoints/step_N), metrics.jsonl (one curve across resumes), config.toml
// (the latest invocation's effective config, for reports), and the checkpoint a run resumes from
// (train.resume), refused when the model settings it was trained with differ from the config's.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/train/checkpoint.h"
#include "core/train/runtime.h"
#include "core/train/train_settings.h"
#include "core/util/folder_lock.h"

namespace kuafu::train {

// A checkpoint to resume from and its trainer state (trainer.json).
struct Resume {
  std::string folder;
  nlohmann::json trainer_state;
  int64_t step() const { return trainer_state.at("step").get<int64_t>(); }
};

class RunFolder {
 public:
  // Locks train.out_dir on the main rank (every rank stops when another run holds it). `fingerprint`:
  // the config key prefixes ("model.") whose values a resumed checkpoint must have been trained with.
  RunFolder(const config::Config& config, const Runtime& runtime, const TrainSettings& settings,
            std::vector<std::string> fingerprint);

  // The checkpoint train.resume names (auto: the latest, if any), its fingerprint checked; none for a
  // fresh run, whose metrics.jsonl then starts empty.
  std::optional<Resume> checkpoint_to_resume() const;
  // After the models loaded `resume`: metrics.jsonl is cut back to its step, and the resume reported.
  void resumed(const Resume& resume) const;

  // Collective: saves `parts` as step `step`'s checkpoint, the config and its fingerprint added to
  // `trainer_state`. With train.async_save the files are written in the background: the checkpoint is
  // complete at finish_checkpoint(), due once checkpoint_writing() is false on every rank.
  void save(int64_t step, const std::vector<CheckpointPart>& parts, nlohmann::json trainer_state,
            const io::NamedTensors& rank_state = {}) const;
  bool checkpoint_writing() const { return checkpoints_->writing(); }
  bool checkpoint_pending() const { return checkpoints_->pending(); }
  void finish_checkpoint() const;  // collective
  std::optional<std::string> latest_checkpoint() const { return checkpoints_->latest(); }
  // Main rank: appends one line to metrics.jsonl.
  void write_metrics(const nlohmann::json& line) const;
  const std::string& path() const { return out_dir_; }

 private:
  nlohmann::json fingerprint() const;
  void trim_metrics_after(int64_t step) const;

  const config::Config& config_;
  const Runtime& runtime_;
  std::vector<std::string> fingerprint_prefixes_;
  std::string out_dir_;
  std::string resume_;  // train.resume
  bool async_save_;     // train.async_save
  std::unique_ptr<FolderLock> lock_;  // main rank: held for the run's life
  std::unique_ptr<CheckpointStore> checkpoints_;
};

}  // namespace kuafu::train

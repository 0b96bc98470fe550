// The train.* keys (how long, in what batches, how often to evaluate, save and log, and where) as one
// typed value: a command reads it once and hands it to what needs it. optim.grad_clip is each model's
// (its section of the config), read by the trainer for each trained model.
#pragma once

#include <cstdint>
#include <string>

#include "core/config/config.h"

namespace kuafu::train {

struct TrainSettings {
  int64_t steps = 0;             // optimizer steps in all, resumed ones included
  int64_t batch_size = 0;        // rows per optimizer step over every rank
  int64_t micro_batch_size = 0;  // rows per rank per micro-step
  int64_t eval_rows = 0;         // rows of the fixed evaluation set
  uint64_t seed = 0;             // initialisation and data order
  int64_t log_interval = 0, eval_interval = 0, checkpoint_interval = 0;  // 0: only at the end
  int64_t keep_checkpoints = 0;
  bool async_save = false;  // checkpoints written by a background thread (CheckpointStore::save_async)
  std::string out_dir;   // checkpoints, metrics.jsonl, logs
  std::string resume;    // "auto", "never" or a checkpoint folder
  std::string progress;  // "auto", "bar" or "plain"
};

// The train.* keys (optim.grad_clip is the optimizer's).
void add_train_schema(config::Schema& schema);
TrainSettings read_train_settings(const config::Config& config);

}  // namespace kuafu::train

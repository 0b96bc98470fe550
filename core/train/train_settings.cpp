#include "core/train/train_settings.h"

namespace kuafu::train {

void add_train_schema(config::Schema& s) {
  s.add_int("train.steps", 1000, "optimizer steps to train for (total, including resumed ones)").min(1);
  s.add_int("train.batch_size", 32, "global batch: rows per optimizer step over all ranks").min(1).max(1 << 24);
  s.add_int("train.micro_batch_size", 8, "rows per rank per micro-step; the rest is gradient accumulation")
      .min(1)
      .max(1 << 24);
  s.add_int("train.seed", 1337, "seed for initialisation and data order").min(0);
  s.add_int("train.log_interval", 10, "steps between plain progress lines").min(1);
  s.add_int("train.eval_interval", 0, "steps between evaluations; 0 = only at the end").min(0);
  s.add_int("train.eval_rows", 64, "evaluation windows (spread evenly over the validation data)").min(1);
  s.add_int("train.checkpoint_interval", 0, "steps between checkpoints; 0 = only at the end and on a stop signal")
      .min(0);
  s.add_int("train.keep_checkpoints", 3, "newest checkpoints to keep").min(1);
  s.add_bool("train.async_save", false,
             "write each checkpoint in the background while training goes on, from a copy in host memory (as "
             "large as what the rank saves); it becomes the latest once every rank has written its part");
  s.add_string("train.out_dir", "runs/default", "folder for checkpoints, metrics.jsonl and logs");
  s.add_string("train.resume", "auto",
               "auto: continue from the latest checkpoint in out_dir if there is one; never: refuse to start "
               "where checkpoints exist; or the path of a checkpoint folder");
  s.add_string("train.progress", "auto", "progress display: auto (bar on a terminal), bar, plain")
      .choices({"auto", "bar", "plain"});
}

TrainSettings read_train_settings(const config::Config& config) {
  TrainSettings t;
  t.steps = config.get_int("train.steps");
  t.batch_size = config.get_int("train.batch_size");
  t.micro_batch_size = config.get_int("train.micro_batch_size");
  t.eval_rows = config.get_int("train.eval_rows");
  t.seed = static_cast<uint64_t>(config.get_int("train.seed"));
  t.log_interval = config.get_int("train.log_interval");
  t.eval_interval = config.get_int("train.eval_interval");
  t.checkpoint_interval = config.get_int("train.checkpoint_interval");
  t.keep_checkpoints = config.get_int("train.keep_checkpoints");
  t.async_save = config.get_bool("train.async_save");
  t.out_dir = config.get_string("train.out_dir");
  t.resume = config.get_string("train.resume");
  t.progress = config.get_string("train.progress");
  return t;
}

}  // namespace kuafu::train

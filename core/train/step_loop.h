// What every training loop does around its steps, whatever it trains (one model or PPO's four): time
// each step, agree over the ranks on the loss and on a stop signal, print progress on the main rank,
// write the step's figures (throughput, MFU, peak memory, bytes sent) to metrics.jsonl, and say when
// to evaluate and to checkpoint. The loop's own work (micro-steps, optimizer steps) stays its own.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/train/progress.h"
#include "core/train/run_folder.h"
#include "core/train/runtime.h"
#include "core/train/train_settings.h"

namespace kuafu::train {

// What a step's throughput and MFU are counted in.
struct StepWork {
  std::string item_name = "tokens";  // "<item_name>_per_s" in metrics.jsonl
  double items_per_step = 0;         // over every rank
  double flops_per_item = 0;         // forward + backward; 0: no MFU figure
  torch::Dtype dtype = torch::kFloat32;  // the compute dtype, whose matrix-product rate MFU is relative to
};

// The ranks' view of a step that has ended.
struct StepOutcome {
  std::vector<double> losses;  // each model's, mean over the world's ranks
  bool non_finite = false;  // on some rank: a non-finite loss or gradient
  bool stop = false;        // some rank received SIGINT/SIGTERM
  bool writing = false;     // some rank is still writing a checkpoint in the background
};

class StepLoop {
 public:
  // Installs the stop signals; progress starts at `start_step` (0-based) of settings.steps.
  StepLoop(const TrainSettings& settings, const Runtime& runtime, const RunFolder& run, int64_t start_step, StepWork work);

  void begin();  // starts a step's clock and byte counters
  // One small all-reduce over the world: each model's mean loss and every rank's non-finite, stop and
  // still-writing (a checkpoint in the background) flags.
  StepOutcome agree(const std::vector<double>& losses, bool non_finite, bool writing = false) const;
  // After the step's work: waits for the device, then prints `fields` ("loss 3.21 | lr ...") with the
  // throughput to the progress line and writes `metrics` with the step's figures to metrics.jsonl.
  void end(int64_t step, nlohmann::json metrics, const std::string& fields);

  // After step `step` (0-based) has ended:
  bool last(int64_t step) const { return step + 1 == settings_.steps; }
  bool evaluation_due(int64_t step) const;                   // every train.eval_interval steps, not the last
  bool checkpoint_due(int64_t step, bool stopping) const;  // every train.checkpoint_interval, the last, a stop

  void print(const std::string& line);  // a line beside the progress bar (main rank)
  void finish_progress();               // ends the bar line before other output

 private:
  const TrainSettings& settings_;
  const Runtime& runtime_;
  const RunFolder& run_;
  StepWork work_;
  double peak_flops_ = 0;
  std::optional<Progress> progress_;  // main rank only
  std::chrono::steady_clock::time_point start_;
  std::map<std::string, int64_t> sent_before_;
};

// Numbers as progress lines show them.
std::string fixed(double value, int digits);
std::string scientific(double value, int digits);

}  // namespace kuafu::train

// Shared pieces of the GPT training tests: a small synthetic corpus with learnable structure, configs
// for a tiny GPT, per-test folders, serial reference runs, metric readers and an injected-loss task.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include "apps/gpt/commands.h"
#include "core/dist/process_group.h"
#include "core/io/safetensors.h"
#include "core/io/token_file.h"
#include "core/train/checkpoint.h"
#include "tests/support/multiprocess.h"
#include "tests/support/training_runs.h"

namespace kuafu::gpt {
namespace fs = std::filesystem;
using testing::metric_lines;
using testing::single_runtime;
using testing::saved;
using testing::expect_same_tensors;


// A corpus with learnable structure: mostly t+1 = (5 t + 3) mod V, sometimes a random token.
inline void write_corpus(const fs::path& dir) {
  fs::create_directories(dir);
  std::mt19937 rng(11);
  for (const auto& [name, n] : {std::pair<std::string, int>{"train.tok", 20000}, {"val.tok", 3000}}) {
    std::vector<uint32_t> tokens(n);
    uint32_t t = 0;
    for (auto& token : tokens) {
      t = rng() % 8 == 0 ? rng() % 64 : (5 * t + 3) % 64;
      token = t;
    }
    io::write_token_file((dir / name).string(), tokens, 64);
  }
}

// One folder per test run, shared by the test process and the workers it starts.
inline fs::path temp_dir(const std::string& name) { return testing::shared_test_dir("gpt_" + name); }

inline config::Config make_config(const fs::path& root, const std::string& out, const std::string& extra) {
  const std::string text = "[model]\nvocab_size = 64\nn_positions = 32\nn_embd = 32\nn_layer = 2\nn_head = 2\n"
                           "[data]\ncontext = 16\ndir = \"" + (root / "data").string() + "\"\n"
                           "[train]\nsteps = 6\nbatch_size = 8\nmicro_batch_size = 8\neval_rows = 16\n"
                           "progress = \"plain\"\nlog_interval = 100\nout_dir = \"" + (root / out).string() + "\"\n"
                           "[optim]\nlr = 3e-3\nwarmup_steps = 2\n[runtime]\nthreads = 1\ndevice = \"cpu\"\n";
  std::vector<std::string> overrides;
  std::istringstream lines(extra);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) overrides.push_back(line);
  }
  return config::Config::from_string(text, "test.toml", gpt_schema(), overrides);
}

// The trainer-level equivalence runs (accumulation, data, tensor, sequence, pipeline parallelism) step
// with plain SGD and no clipping: each step then moves the weights by exactly lr x gradient, so a gradient
// off by a constant factor (a missing 1/accumulation, a sum instead of a mean) changes the weights, which
// AdamW's normalised steps and clipping at 1.0 would hide. Their metrics' grad_norm is compared too.
inline const std::string kPlainSgd =
    "optim.name=\"sgd\"\noptim.momentum=0\noptim.weight_decay=0\noptim.grad_clip=0\noptim.lr=0.3\n";

inline std::vector<double> losses_of(const fs::path& metrics) {
  std::vector<double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto json = nlohmann::json::parse(line);
    if (json.contains("loss")) losses.push_back(json["loss"].get<double>());
  }
  return losses;
}

// Trains in this process with a single-rank runtime (also inside multi-rank workers).
inline std::vector<torch::Tensor> train_serially(const config::Config& config) {
  auto runtime = single_runtime();
  auto task = make_text_task(config);
  train::Trainer trainer(config, runtime, *task);
  trainer.run();
  return task->model().parameters();
}

inline double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

// Wraps the text task and multiplies the loss of the listed steps by `factor` (NaN, inf): injected
// divergence and fp16-style gradient overflow.
struct InjectedTask : train::TrainTask {
  InjectedTask(std::unique_ptr<TextTask> inner, std::set<int64_t> steps, double factor)
      : inner(std::move(inner)), steps(std::move(steps)), factor(factor) {}
  torch::nn::Module& model() override { return inner->model(); }
  torch::Tensor loss(int64_t step, int64_t first, int64_t rows) override {
    torch::Tensor l = inner->loss(step, first, rows);
    return steps.count(step) ? l * factor : l;
  }
  train::LossSum evaluate(int r, int n) override { return inner->evaluate(r, n); }
  double flops_per_item() const override { return inner->flops_per_item(); }
  int64_t items_per_row() const override { return inner->items_per_row(); }
  std::vector<std::string> checkpoint_keys() const override { return inner->checkpoint_keys(); }
  bool set_block_hooks(hooks::BlockHooks* hooks) override { return inner->set_block_hooks(hooks); }
  DeferredWeights deferred_weights() const override { return inner->deferred_weights(); }
  std::unique_ptr<TextTask> inner;
  std::set<int64_t> steps;
  double factor;
};

// The largest relative difference between two runs' per-step gradient norms (before clipping), read from
// their metrics.jsonl: the gradients themselves compared, factor by factor.
inline double grad_norm_difference(const fs::path& run, const fs::path& reference) {
  const auto a = metric_lines(run / "metrics.jsonl"), b = metric_lines(reference / "metrics.jsonl");
  EXPECT_EQ(a.size(), b.size()) << run << " vs " << reference;
  EXPECT_FALSE(a.empty()) << run;
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double x = a[i].at("grad_norm").get<double>(), y = b[i].at("grad_norm").get<double>();
    worst = std::max(worst, std::abs(x - y) / std::max(std::abs(y), 1e-30));
  }
  return worst;
}

// Trains run `name` of `config_text` with step 3's loss made to overflow (InjectedTask; `skipped` overflowed
// steps expected) on `world`; returns its metrics lines, read on every rank from rank 0's file.
inline std::vector<nlohmann::json> train_with_an_overflow(const fs::path& root, const std::string& name,
                                                          const std::string& config_text,
                                                          const std::shared_ptr<dist::World>& world, int64_t skipped = 1) {
  const auto config = make_config(root, name, config_text);
  {
    train::Runtime runtime = train::start_runtime(config, world);
    InjectedTask task(make_text_task(config), {2}, std::numeric_limits<double>::infinity());
    train::Trainer trainer(config, runtime, task);
    EXPECT_EQ(trainer.run().skipped_steps, skipped) << name;
  }
  dist::barrier(*world->world_group());
  return metric_lines(root / name / "metrics.jsonl");
}

// Two runs' final checkpoints (weights and optimizer state) agree to `relative` of each tensor's largest value.
inline void expect_same_run(const fs::path& root, const std::string& run, const std::string& reference, double relative) {
  expect_same_tensors(saved(root, run, "model.safetensors"), saved(root, reference, "model.safetensors"), relative,
                      1.0, run + " weights");
  expect_same_tensors(saved(root, run, "optimizer.safetensors"), saved(root, reference, "optimizer.safetensors"),
                      relative, 1.0, run + " optimizer state");
}

class GPTTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    if (!testing::is_worker()) {  // workers find the corpus their parent wrote
      fs::remove_all(root_);
      write_corpus(root_ / "data");
    }
  }
  fs::path root_;
};

}  // namespace kuafu::gpt

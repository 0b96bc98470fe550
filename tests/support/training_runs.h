// Reading what a training run left behind, for tests that compare runs: a single-process runtime to
// train in, the steps' metrics lines, the per-step gradient norms and a checkpoint's weights.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "core/train/runtime.h"
#include "core/train/trainer.h"

namespace kuafu::testing {

// One rank, a mesh of one data axis (also usable inside multi-rank workers).
inline train::Runtime single_runtime() {
  train::Runtime runtime;
  runtime.world = dist::World::single();
  runtime.mesh = std::make_shared<dist::ProcessMesh>(runtime.world, std::vector<dist::MeshAxis>{{"data", 1}});
  return runtime;
}

// The lines of `metrics` (a metrics.jsonl) that describe training steps (those with a "loss").
inline std::vector<nlohmann::json> metric_lines(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto json = nlohmann::json::parse(line);
    if (json.contains("loss")) lines.push_back(json);
  }
  return lines;
}

// Each step's gradient norm (before clipping) of the run whose out_dir is `run`.
inline std::vector<double> grad_norms(const std::filesystem::path& run) {
  std::vector<double> norms;
  for (const auto& line : metric_lines(run / "metrics.jsonl")) norms.push_back(line.at("grad_norm").get<double>());
  return norms;
}

// The tensors of `file` ("model.safetensors", "unet.ema.model.safetensors", "optimizer.safetensors") in
// checkpoint `folder`, whole, whether one rank wrote it or every rank its pieces (checkpoint_shards.h).
inline io::SafetensorsFile saved_file(const std::string& folder, const std::string& file) {
  const std::string stem = file.substr(0, file.size() - std::string(".safetensors").size());
  const size_t dot = stem.rfind('.');
  const std::string part = dot == std::string::npos ? "" : stem.substr(0, dot);
  io::SafetensorsFile out;
  out.tensors = train::CheckpointStore::read_whole(folder, stem.substr(dot == std::string::npos ? 0 : dot + 1), part);
  return out;
}

// The weights (whole tensors) of the step-`step` checkpoint of the run whose out_dir is `run`.
inline io::SafetensorsFile checkpoint_weights(const std::filesystem::path& run, int step) {
  return saved_file(train::checkpoint_folder((run / "checkpoints").string(), step), "model.safetensors");
}

// One file of the step-`step` checkpoint of run `name` (whole tensors, whatever the strategy).
inline io::SafetensorsFile saved(const std::filesystem::path& root, const std::string& name, const std::string& file, int step = 6) {
  return saved_file(train::checkpoint_folder((root / name / "checkpoints").string(), step), file);
}

// Every tensor of `expected` is in `actual`, within `relative` x its largest magnitude (at least `floor`).
inline void expect_same_tensors(const io::SafetensorsFile& actual, const io::SafetensorsFile& expected, double relative,
                         double floor, const std::string& what) {
  ASSERT_EQ(actual.tensors.size(), expected.tensors.size()) << what;
  for (const auto& [name, tensor] : expected.tensors) {
    const torch::Tensor* found = actual.find(name);
    ASSERT_TRUE(found) << what << " lacks " << name;
    ASSERT_EQ(found->sizes(), tensor.sizes()) << what << " " << name;
    const double scale = std::max(floor, tensor.abs().max().item<double>());
    EXPECT_LE((*found - tensor).abs().max().item<double>(), relative * scale) << what << " " << name;
  }
}

// The config of a run whose gradients sgd_step_gradients can read back: `steps` steps of plain SGD at `lr`
// (no momentum, decay, clipping or schedule) in float64 on one CPU thread, batches of `batch_size` rows in one
// micro-batch, a checkpoint after every step into `out_dir`, no evaluation before the end; `overrides`
// ("key=value" lines) over that.
inline config::Config sgd_float64_config(const std::filesystem::path& out_dir, int steps, double lr, int batch_size,
                                         const std::string& overrides) {
  config::Schema schema;
  train::add_runtime_schema(schema);
  train::add_trainer_schema(schema);
  const std::string text = "[train]\nsteps = " + std::to_string(steps) + "\nbatch_size = " + std::to_string(batch_size) +
                           "\nmicro_batch_size = " + std::to_string(batch_size) + "\neval_rows = " + std::to_string(batch_size) +
                           "\neval_interval = 0\ncheckpoint_interval = 1\nkeep_checkpoints = " + std::to_string(steps + 2) +
                           "\nprogress = \"plain\"\nout_dir = \"" + out_dir.string() +
                           "\"\n[optim]\nname = \"sgd\"\nmomentum = 0.0\nweight_decay = 0.0\ngrad_clip = 0.0\nlr = " +
                           std::to_string(lr) + "\nwarmup_steps = 0\nschedule = \"constant\"\n[precision]\ndtype = \"fp64\"\n"
                           "[runtime]\nthreads = 1\ndevice = \"cpu\"\n[dist]\ntimeout_s = 60\n";
  std::vector<std::string> lines;
  std::istringstream in(overrides);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return config::Config::from_string(text, out_dir.filename().string() + ".toml", schema, lines);
}

// Each step's gradients of the run whose out_dir is `run`, trained by plain SGD at `lr` (no momentum, decay
// or clipping) with a checkpoint after every step: step s's is (w[s-1] - w[s]) / lr, w[0] the weights of
// `initial` (the run's seeded model).
inline std::vector<std::map<std::string, torch::Tensor>> sgd_step_gradients(const std::filesystem::path& run,
                                                                            torch::nn::Module& initial, int steps, double lr) {
  std::map<std::string, torch::Tensor> before;
  for (const auto& item : initial.named_parameters()) before[item.key()] = item.value().detach().clone();
  std::vector<std::map<std::string, torch::Tensor>> out;
  for (int s = 1; s <= steps; ++s) {
    const io::SafetensorsFile weights = checkpoint_weights(run, s);
    std::map<std::string, torch::Tensor> grads;
    for (const auto& [key, w] : before) {
      const torch::Tensor* after = weights.find(key);
      EXPECT_TRUE(after) << run << " step " << s << " lacks " << key;
      if (!after) continue;
      grads[key] = (w - after->to(w.scalar_type())) / lr;
      before[key] = *after;
    }
    out.push_back(grads);
  }
  return out;
}

// Every gradient of `expected` within `tolerance` x max(1, its largest magnitude).
inline void expect_same_gradients(const std::map<std::string, torch::Tensor>& actual,
                                  const std::map<std::string, torch::Tensor>& expected, double tolerance, const std::string& what) {
  auto as_file = [](const std::map<std::string, torch::Tensor>& grads) { return io::SafetensorsFile{{grads.begin(), grads.end()}, {}}; };
  expect_same_tensors(as_file(actual), as_file(expected), tolerance, /*floor=*/1.0, what);
}

}  // namespace kuafu::testing

// A toy model defined only here, as maths (a head, residual MLP blocks, a tail), gets data, tensor
// (1D), pipeline and Gemini parallelism from the config alone through train::parallelize and the
// trainer, and each run equals the serial one over 3 plain SGD steps (no clipping): the same weights
// within 2e-5 and per-step gradient norms within 1e-5 relative (float32, only summation order differs).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "core/train/model_task.h"
#include "tests/support/multiprocess.h"
#include "tests/support/training_runs.h"
#include "tests/support/worker_world.h"

namespace kuafu::train {
namespace {
namespace fs = std::filesystem;

// The whole model: x [B, T, 4] -> W_in -> L x (h + W_2 gelu(W_1 h)) -> w_out -> mean squared error.
struct ToyImpl : torch::nn::Module, hooks::OneStreamModel {
  explicit ToyImpl(const parallel::ModelOptions& options) : tp(options.tp) {
    in = register_module("in", parallel::SerialLinear(parallel::LinearSpec{4, 16}, options.device));
    auto h = register_module("h", std::make_shared<torch::nn::Module>());
    for (int i = 0; i < 4; ++i) {
      auto block = h->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
      up.push_back(parallel::make_linear(options, {16, 32}, parallel::Cut::kColumn));
      down.push_back(parallel::make_linear(options, {32, 16}, parallel::Cut::kRow));
      block->register_module("up", up.back().ptr());
      block->register_module("down", down.back().ptr());
    }
    out = register_module("out", parallel::SerialLinear(parallel::LinearSpec{16, 1}, options.device));
    parallel::initialize_like_serial(*this, tp, [](const std::string&, torch::Tensor& full) {
      full.normal_(0.0, 0.1);
      return true;
    });
  }
  torch::nn::Module& module() override { return *this; }
  int64_t num_blocks() const override { return static_cast<int64_t>(up.size()); }
  hooks::ModelPart head_part() const override { return {"in", {"in"}}; }
  hooks::ModelPart block_part(int64_t i) const override { return {"h." + std::to_string(i), {"h." + std::to_string(i)}}; }
  hooks::ModelPart tail_part() const override { return {"out", {"out"}}; }
  torch::Tensor head(const torch::Tensor& x) override { return parallel::enter_stream(tp, in(x)); }
  torch::Tensor block(int64_t i, const torch::Tensor& h, const torch::Tensor& /*context*/) override {
    return h + down[static_cast<size_t>(i)].forward(torch::gelu(up[static_cast<size_t>(i)].forward(h)));
  }
  torch::Tensor tail_loss(const torch::Tensor& h, const torch::Tensor& y) override { return torch::mse_loss(out(h), y); }
  torch::Tensor tail_sums(const torch::Tensor& h, const torch::Tensor& y) override {
    const double n = static_cast<double>(y.numel());
    return torch::tensor({tail_loss(h, y).item<double>() * n, n, 0.0}, torch::kFloat64);
  }
  parallel::TensorParallel tp;
  parallel::SerialLinear in{nullptr}, out{nullptr};
  std::vector<torch::nn::AnyModule> up, down;
};
TORCH_MODULE(Toy);

// 64 fixed rows of a smooth target; step s takes rows [8 s, 8 s + 8) (mod 64).
Batch toy_data() {
  auto generator = at::detail::createCPUGenerator(3);
  const torch::Tensor x = torch::randn({64, 3, 4}, generator, torch::kFloat32);
  return {x, torch::sin(x.sum(-1, /*keepdim=*/true))};
}

struct ToyTask : ModelTask {
  ToyTask(Toy toy, const ParallelOptions& options, int64_t micro_batch)
      : ModelTask(std::make_unique<ParallelModel>(*toy, options), micro_batch, 1), toy(std::move(toy)) {
    const Batch data = toy_data();
    x = data.inputs;
    y = data.targets;
  }
  Batch train_batch(int64_t step, int64_t first_row, int64_t rows) override {
    return {x.narrow(0, (8 * step + first_row) % 64, rows), y.narrow(0, (8 * step + first_row) % 64, rows)};
  }
  int64_t eval_rows() const override { return 16; }
  Batch eval_batch(int64_t first_row, int64_t rows) override { return {x.narrow(0, first_row, rows), y.narrow(0, first_row, rows)}; }
  double flops_per_item() const override { return 1.0; }
  int64_t items_per_row() const override { return 3; }
  std::vector<std::string> checkpoint_keys() const override { return {}; }
  Toy toy;
  torch::Tensor x, y;
};

fs::path test_root() { return testing::shared_test_dir("toy"); }

config::Config toy_config(const std::string& name, const std::string& extra) {
  config::Schema schema;
  add_runtime_schema(schema);
  add_trainer_schema(schema);
  const std::string text = "[train]\nsteps = 3\nbatch_size = 8\nmicro_batch_size = 8\neval_rows = 16\n"
                           "progress = \"plain\"\nout_dir = \"" + (test_root() / name).string() + "\"\n"
                           "[optim]\nname = \"sgd\"\nmomentum = 0.0\nweight_decay = 0.0\ngrad_clip = 0.0\n"
                           "lr = 0.05\nwarmup_steps = 0\n[runtime]\nthreads = 1\ndevice = \"cpu\"\n[dist]\ntimeout_s = 60\n";
  std::vector<std::string> overrides;
  std::istringstream lines(extra);
  for (std::string line; std::getline(lines, line);) overrides.push_back(line);
  return config::Config::from_string(text, name + ".toml", schema, overrides);
}

// Trains the toy under `config` on `runtime` (the task built as an app builds its own).
void train_toy(const config::Config& config, Runtime& runtime) {
  torch::manual_seed(1);
  Toy toy(runtime.model_options());
  const int64_t micro = config.get_int("train.micro_batch_size");
  const Batch data = toy_data();  // a sample micro-batch, for "time" partitions
  const ParallelOptions options =
      parallel_options(*toy, config, runtime, {data.inputs.narrow(0, 0, micro), data.targets.narrow(0, 0, micro)});
  ToyTask task(toy, options, micro);
  Trainer(config, runtime, task).run();
}

io::SafetensorsFile final_weights(const std::string& name) { return testing::checkpoint_weights(test_root() / name, 3); }

std::vector<double> grad_norms(const std::string& name) { return testing::grad_norms(test_root() / name); }

void expect_equals_serial(const std::string& name) {
  SCOPED_TRACE(name);
  const io::SafetensorsFile actual = final_weights(name), expected = final_weights("serial");
  ASSERT_EQ(actual.tensors.size(), expected.tensors.size());
  for (const auto& [key, tensor] : expected.tensors) {
    ASSERT_TRUE(actual.find(key)) << key;
    EXPECT_LT((*actual.find(key) - tensor).abs().max().item<double>(), 2e-5) << key;
  }
  const auto a = grad_norms(name), b = grad_norms("serial");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * b[i]) << "step " << i + 1;
}

const std::vector<std::pair<std::string, std::string>> kStrategies = {
    {"data", "train.micro_batch_size=4"},
    {"tensor_1d", "parallel.tensor.mode=\"1d\""},
    {"pipeline", "parallel.pipeline=2"},
    {"gemini", "memory.strategy=\"gemini\""},
};

TEST(ParallelizeTest, AToyModelGetsEveryStrategyFromTheConfigAndEqualsSerial) {
  if (!testing::is_worker()) {
    fs::remove_all(test_root());
    auto single = dist::World::single();
    const config::Config serial = toy_config("serial", "");
    Runtime runtime = start_runtime(serial, single);
    train_toy(serial, runtime);
    testing::run_test_on_ranks(2, 180);
    for (const auto& [name, overrides] : kStrategies) expect_equals_serial(name);
    return;
  }
  auto world = testing::worker_world();
  for (const auto& [name, overrides] : kStrategies) {
    std::string extra = overrides;
    if (name == "tensor_1d") extra += "\nparallel.tensor.size=2";
    if (name == "pipeline") extra += "\ntrain.micro_batch_size=2";
    if (name == "gemini") extra += "\ntrain.micro_batch_size=4";
    const config::Config config = toy_config(name, extra);
    Runtime runtime = start_runtime(config, world);
    train_toy(config, runtime);
  }
}

// A task's own evaluation figures: its LossSum::extra sums are added over the data ranks and turned into
// metrics by the task (here each rank's number and a count of ranks: 1 + 2 and 2 on two ranks; and a
// root mean square error from the loss sums), written to metrics.jsonl and the progress line.
struct ToyWithOwnMetrics : ToyTask {
  using ToyTask::ToyTask;
  LossSum evaluate(int rank, int ranks) override {
    LossSum sums = ToyTask::evaluate(rank, ranks);
    sums.extra = {static_cast<double>(rank + 1), 1.0};
    return sums;
  }
  std::vector<EvalMetric> eval_metrics(const LossSum& sums) const override {
    return {{"val_rmse", "RMSE", std::sqrt(sums.loss_sum / sums.count)},
            {"val_rank_numbers", "rank numbers", sums.extra.at(0)},
            {"val_ranks", "ranks", sums.extra.at(1)}};
  }
};

TEST(ParallelizeTest, ATaskReportsItsOwnEvaluationFigures) {
  if (!testing::is_worker()) {
    fs::remove_all(test_root() / "own_metrics");
    testing::run_test_on_ranks(2, 120);
    std::ifstream in(test_root() / "own_metrics" / "metrics.jsonl");
    nlohmann::json eval;
    for (std::string line; std::getline(in, line);) {
      const auto json = nlohmann::json::parse(line);
      if (json.contains("val_loss")) eval = json;
    }
    ASSERT_TRUE(eval.is_object()) << "no evaluation line";
    EXPECT_EQ(eval.value("val_rank_numbers", 0.0), 3.0);
    EXPECT_EQ(eval.value("val_ranks", 0.0), 2.0);
    EXPECT_NEAR(eval.value("val_rmse", 0.0), std::sqrt(eval.value("val_loss", -1.0)), 1e-12);
    EXPECT_FALSE(eval.contains("val_ppl")) << "the task's figures replace the default perplexity";
    return;
  }
  const config::Config config = toy_config("own_metrics", "train.micro_batch_size=4");
  Runtime runtime = start_runtime(config, testing::worker_world());
  torch::manual_seed(1);
  Toy toy(runtime.model_options());
  const Batch data = toy_data();
  ToyWithOwnMetrics task(toy, parallel_options(*toy, config, runtime, {data.inputs.narrow(0, 0, 4), data.targets.narrow(0, 0, 4)}), 4);
  Trainer(config, runtime, task).run();
}

}  // namespace
}  // namespace kuafu::train

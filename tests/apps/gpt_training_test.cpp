// End-to-end GPT training through the Trainer on a small synthetic corpus: loss goes down, gradient
// accumulation equals the large batch, data parallelism on 2 Gloo ranks equals 1 rank, a resumed
// run follows the uninterrupted loss curve exactly, and stop / divergence keep the last checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "apps/gpt/commands.h"
#include "core/io/token_file.h"
#include "core/util/error.h"
#include "tests/support/multiprocess.h"

namespace kuafu::gpt {
namespace {
namespace fs = std::filesystem;

// A corpus with learnable structure: mostly t+1 = (5 t + 3) mod V, sometimes a random token.
void write_corpus(const fs::path& dir) {
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
fs::path temp_dir(const std::string& name) {
  const int owner = testing::is_worker() ? ::getppid() : ::getpid();
  return fs::temp_directory_path() / ("kuafu_gpt_" + name + "_" + std::to_string(owner));
}

config::Config make_config(const fs::path& root, const std::string& out, const std::string& extra) {
  const std::string text = "[model]\nvocab_size = 64\nn_positions = 32\nn_embd = 32\nn_layer = 2\nn_head = 2\n"
                           "[data]\ncontext = 16\ndir = \"" + (root / "data").string() + "\"\n"
                           "[train]\nsteps = 6\nbatch_size = 8\nmicro_batch_size = 8\neval_rows = 16\n"
                           "progress = \"plain\"\nlog_interval = 100\nout_dir = \"" + (root / out).string() + "\"\n"
                           "[optim]\nlr = 3e-3\nwarmup_steps = 2\n[runtime]\nthreads = 1\n";
  std::vector<std::string> overrides;
  std::istringstream lines(extra);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) overrides.push_back(line);
  }
  return config::Config::from_string(text, "test.toml", gpt_schema(), overrides);
}

std::vector<double> losses_of(const fs::path& metrics) {
  std::vector<double> losses;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto json = nlohmann::json::parse(line);
    if (json.contains("loss")) losses.push_back(json["loss"].get<double>());
  }
  return losses;
}

// Trains in this process with a single-rank runtime (also inside multi-rank workers).
std::vector<torch::Tensor> train_serially(const config::Config& config) {
  train::Runtime runtime;
  runtime.world = dist::World::single();
  runtime.mesh = std::make_shared<dist::ProcessMesh>(runtime.world, std::vector<dist::MeshAxis>{{"data", 1}});
  auto task = make_text_task(config);
  train::Trainer trainer(config, runtime, *task);
  trainer.run();
  return task->model().parameters();
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
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

TEST_F(GPTTrainingTest, LossGoesDownAndMetricsAreWritten) {
  const auto config = make_config(root_, "run", "train.steps=30\noptim.lr=1e-2");
  train_serially(config);
  const auto losses = losses_of(root_ / "run" / "metrics.jsonl");
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), losses.front() - 1.0) << "first " << losses.front() << " last " << losses.back();
  EXPECT_TRUE(fs::exists(train::checkpoint_folder((root_ / "run" / "checkpoints").string(), 30)));
}

// Tolerance 2e-5: the two runs differ only in float32 summation order (4 + 4 rows vs 8 rows).
TEST_F(GPTTrainingTest, GradientAccumulationEqualsLargeBatch) {
  const auto large = train_serially(make_config(root_, "large", ""));
  const auto accumulated = train_serially(make_config(root_, "accumulated", "train.micro_batch_size=2"));
  EXPECT_LT(max_difference(large, accumulated), 2e-5);
}

TEST_F(GPTTrainingTest, ResumeFollowsTheUninterruptedLossCurveExactly) {
  train_serially(make_config(root_, "straight", ""));
  train_serially(make_config(root_, "resumed", "train.steps=3"));
  train_serially(make_config(root_, "resumed", ""));  // picks up the step-3 checkpoint
  const auto straight = losses_of(root_ / "straight" / "metrics.jsonl");
  const auto resumed = losses_of(root_ / "resumed" / "metrics.jsonl");
  ASSERT_EQ(straight.size(), 6u);
  ASSERT_EQ(resumed.size(), 6u);
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
}

TEST_F(GPTTrainingTest, ResumeRefusesACheckpointOfAnotherModel) {
  train_serially(make_config(root_, "run", "train.steps=2"));
  try {
    train_serially(make_config(root_, "run", "model.n_embd=64"));
    FAIL() << "a checkpoint of another model shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_embd"), std::string::npos) << e.what();
  }
}

TEST_F(GPTTrainingTest, StopSignalCheckpointsAndResumes) {
  const auto config = make_config(root_, "run", "");
  train::request_stop();  // as if SIGTERM arrived during the first step
  train_serially(config);
  train::clear_stop_request();
  const auto latest = train::CheckpointStore::read_trainer_state(
      train::checkpoint_folder((root_ / "run" / "checkpoints").string(), 1));
  EXPECT_EQ(latest.at("step"), 1);
}

// A task whose loss turns NaN at step 3: the trainer must stop with an error and leave step 2's checkpoint.
TEST_F(GPTTrainingTest, NonFiniteLossStopsAndKeepsLastGoodCheckpoint) {
  const auto config = make_config(root_, "run", "train.checkpoint_interval=1");
  train::Runtime runtime;
  runtime.world = dist::World::single();
  runtime.mesh = std::make_shared<dist::ProcessMesh>(runtime.world, std::vector<dist::MeshAxis>{{"data", 1}});
  struct Poisoned : train::TrainTask {
    explicit Poisoned(std::unique_ptr<TextTask> inner) : inner(std::move(inner)) {}
    torch::nn::Module& model() override { return inner->model(); }
    torch::Tensor loss(int64_t step, int64_t first, int64_t rows) override {
      torch::Tensor l = inner->loss(step, first, rows);
      return step == 2 ? l * std::numeric_limits<double>::quiet_NaN() : l;
    }
    train::LossSum evaluate(int r, int n) override { return inner->evaluate(r, n); }
    double flops_per_item() const override { return inner->flops_per_item(); }
    int64_t items_per_row() const override { return inner->items_per_row(); }
    std::vector<std::string> checkpoint_keys() const override { return inner->checkpoint_keys(); }
    std::unique_ptr<TextTask> inner;
  } task(make_text_task(config));
  train::Trainer trainer(config, runtime, task);
  try {
    trainer.run();
    FAIL() << "a NaN loss did not stop training";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step_00000002"), std::string::npos) << e.what();
  }
  const auto root = (root_ / "run" / "checkpoints").string();
  EXPECT_EQ(*train::CheckpointStore(root, runtime.world->world_group(), 3).latest(), train::checkpoint_folder(root, 2));
  EXPECT_FALSE(fs::exists(train::checkpoint_folder(root, 3)));
}

// Same global batch of 8 rows: 2 ranks x 4 rows against 1 rank x 8 rows, 6 AdamW steps.
// Tolerance 2e-5: only float32 summation order differs (per-rank means averaged vs one mean).
TEST_F(GPTTrainingTest, TwoDataParallelRanksEqualOneRank) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  const auto config = make_config(root_, "parallel", "train.micro_batch_size=4\ndist.timeout_s=30");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config);
  train::Trainer trainer(config, runtime, *task);
  trainer.run();
  const auto serial = train_serially(make_config(root_, "serial_rank" + std::to_string(runtime.world->rank()), ""));
  EXPECT_LT(max_difference(task->model().parameters(), serial), 2e-5);
}

}  // namespace
}  // namespace kuafu::gpt

// ZeRO through the trainer, from the config alone: stages 1 and 2 on 1, 2 and 4 Gloo ranks take the
// same steps as plain data parallelism (weights and optimizer state), with gradient accumulation and a
// dynamic loss scale that skips an overflowed step; a sharded checkpoint written on 2 ranks resumes on
// 1 and 4 and continues the serial run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "core/io/safetensors.h"
#include "tests/apps/gpt_training_support.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::gpt {
namespace {

class GPTMemoryTest : public GPTTrainingTest {};

// 16 rows per step in micro-batches of 2: 8, 4 and 2 accumulated micro-steps on 1, 2 and 4 ranks. The
// loss scale starts at 1024 and step 3's loss is made infinite, so that step is skipped on every rank.
const std::string kCommon =
    "train.batch_size=16\ntrain.micro_batch_size=2\ndist.timeout_s=30\nprecision.loss_scale=\"dynamic\"\n"
    "precision.initial_scale=1024\nprecision.hysteresis=1\noptim.grad_clip=0.5";

// Trains `name` with `strategy` on the world the runtime joined; returns the trained weights.
std::vector<torch::Tensor> train_with(const fs::path& root, const std::string& name, const std::string& strategy,
                                      const std::shared_ptr<dist::World>& world) {
  const auto config = make_config(root, name, kCommon + "\nmemory.strategy=\"" + strategy + "\"");
  train::Runtime runtime = train::start_runtime(config, world);
  InjectedTask task(make_text_task(config), {2}, std::numeric_limits<double>::infinity());
  train::Trainer trainer(config, runtime, task);
  const auto summary = trainer.run();
  EXPECT_EQ(summary.skipped_steps, 1) << strategy;
  std::vector<torch::Tensor> weights;
  for (const auto& p : task.model().parameters()) weights.push_back(p.detach().clone());
  return weights;
}

// The last checkpoint's optimizer state (whole tensors, whatever the strategy).
io::SafetensorsFile saved_state(const fs::path& root, const std::string& name) {
  return io::load_safetensors(
      (fs::path(train::checkpoint_folder((root / name / "checkpoints").string(), 6)) / "optimizer.safetensors").string());
}

// Tolerance 2e-5 on weights and 1e-6 on Adam's moments: float32, only the order of the sums differs
// (reduce-scatter vs all-reduce, norms added piece by piece).
void zero_stages_equal_plain_data_parallel(const fs::path& root, const std::shared_ptr<dist::World>& world) {
  const auto plain = train_with(root, "plain", "none", world);
  for (const std::string stage : {"zero1", "zero2"}) {
    const auto sharded = train_with(root, stage, stage, world);
    EXPECT_LT(max_difference(sharded, plain), 2e-5) << stage;
    if (world->rank() != 0) continue;
    const auto expected = saved_state(root, "plain");
    const auto actual = saved_state(root, stage);
    ASSERT_EQ(actual.tensors.size(), expected.tensors.size()) << stage;
    for (const auto& [name, tensor] : expected.tensors) {
      const torch::Tensor* found = actual.find(name);
      ASSERT_TRUE(found) << stage << " lacks " << name;
      ASSERT_EQ(found->sizes(), tensor.sizes()) << name;
      EXPECT_LT((*found - tensor).abs().max().item<double>(), name == "step" ? 0.5 : 1e-6) << stage << " " << name;
    }
  }
}

TEST_F(GPTMemoryTest, ZeroOnOneRankEqualsPlainTraining) {
  zero_stages_equal_plain_data_parallel(root_, dist::World::single());
}

TEST_F(GPTMemoryTest, ZeroOnTwoRanksEqualsPlainDataParallel) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  zero_stages_equal_plain_data_parallel(root_, testing::worker_world());
}

TEST_F(GPTMemoryTest, ZeroOnFourRanksEqualsPlainDataParallel) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  zero_stages_equal_plain_data_parallel(root_, testing::worker_world());
}

// A ZeRO-2 checkpoint written by 2 ranks after 3 of 6 steps holds whole tensors: it resumes on 4 ranks
// (ZeRO-2) and on 1 (ZeRO-1), and both finish equal to 6 uninterrupted serial steps (2e-5: float32 sums).
const std::string kResharding = "train.batch_size=16\ntrain.micro_batch_size=2\ndist.timeout_s=30\n"
                                "train.checkpoint_interval=3";

void resume_and_compare(const fs::path& root, const std::string& name, const std::string& strategy,
                        const std::shared_ptr<dist::World>& world) {
  const fs::path out = root / name;
  if (world->rank() == 0) fs::create_directories(out);
  if (world->rank() == 0) fs::copy(root / "written_on_2" / "checkpoints", out / "checkpoints", fs::copy_options::recursive);
  dist::barrier(*world->world_group());
  const auto config = make_config(root, name, kResharding + "\nmemory.strategy=\"" + strategy + "\"");
  train::Runtime runtime = train::start_runtime(config, world);
  auto task = make_text_task(config);
  train::Trainer trainer(config, runtime, *task);
  EXPECT_EQ(trainer.start_step(), 3);
  trainer.run();
  const auto serial = train_serially(make_config(root, "serial_" + name + "_" + std::to_string(world->rank()), kResharding));
  EXPECT_LT(max_difference(task->model().parameters(), serial), 2e-5) << name;
}

TEST_F(GPTMemoryTest, ZeroCheckpointFromTwoRanksResumesOnOneAndFour) {
  const char* phase = std::getenv("KUAFU_TEST_PHASE");
  if (!testing::is_worker()) {
    testing::run_test_on_ranks(2, 120, {{"KUAFU_TEST_PHASE", "write"}});
    testing::run_test_on_ranks(4, 180, {{"KUAFU_TEST_PHASE", "resume"}});
    resume_and_compare(root_, "resumed_on_1", "zero1", dist::World::single());
    return;
  }
  const auto world = testing::worker_world();
  if (std::string(phase) == "write") {
    const auto config = make_config(root_, "written_on_2", kResharding + "\ntrain.steps=3\nmemory.strategy=\"zero2\"");
    train::Runtime runtime = train::start_runtime(config, world);
    auto task = make_text_task(config);
    train::Trainer(config, runtime, *task).run();
  } else {
    resume_and_compare(root_, "resumed_on_4", "zero2", world);
  }
}

// ZeRO shards over data parallelism only: tensor and pipeline parallelism are refused at the key.
TEST_F(GPTMemoryTest, ZeroWithTensorParallelismIsRefusedAtTheKey) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 60);
  const auto config = make_config(root_, "refused", "memory.strategy=\"zero2\"\nparallel.tensor.mode=\"1d\"\n"
                                                    "parallel.tensor.size=2\ndist.timeout_s=30");
  train::Runtime runtime = train::start_runtime(config, testing::worker_world());
  auto task = make_text_task(config, runtime.tensor);
  const std::string message = testing::error_message([&] { train::Trainer(config, runtime, *task); });
  EXPECT_NE(message.find("memory.strategy"), std::string::npos) << message;
  EXPECT_NE(message.find("parallel.tensor"), std::string::npos) << message;
}

}  // namespace
}  // namespace kuafu::gpt

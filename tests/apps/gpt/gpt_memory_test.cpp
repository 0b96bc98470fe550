// ZeRO and Gemini through the trainer, from the config alone: ZeRO-1, ZeRO-2 and Gemini (ZeRO-3 chunks
// gathered around each block) on 1, 2 and 4 Gloo ranks take the same steps as plain data parallelism
// (weights and optimizer state), with gradient accumulation and a dynamic loss scale that skips an
// overflowed step; a sharded checkpoint written on 2 ranks resumes on 1 and 4 and continues the serial run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "core/io/safetensors.h"
#include "core/memory/gemini.h"
#include "core/train/parallelize.h"
#include "tests/apps/gpt/gpt_training_support.h"
#include "tests/support/json_lines.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::gpt {
namespace {

class GPTMemoryTest : public GPTTrainingTest {};

// 16 rows per step in micro-batches of 2: 8, 4 and 2 accumulated micro-steps on 1, 2 and 4 ranks. The
// loss scale starts at 1024 and step 3's loss is made infinite, so that step is skipped on every rank.
// No clipping: a clipped gradient has the same norm whatever its scale, which would hide a wrong average
// (Adam's step is scale-free too; its moments are not, and the state check below sees them). Chunks of
// 4 KiB (1,024 elements) give the tiny GPT several chunks, some shared by two blocks.
const std::string kCommon =
    "train.batch_size=16\ntrain.micro_batch_size=2\ndist.timeout_s=30\nprecision.loss_scale=\"dynamic\"\n"
    "precision.initial_scale=1024\nprecision.hysteresis=1\noptim.grad_clip=0\nmemory.chunk_mb=0.00390625";

// Trains `name` with `strategy` on the world the runtime joined (6 steps, checkpoint at the end).
void train_with(const fs::path& root, const std::string& name, const std::string& strategy,
                const std::shared_ptr<dist::World>& world) {
  const auto config = make_config(root, name, kCommon + "\nmemory.strategy=\"" + strategy + "\"");
  train::Runtime runtime = train::start_runtime(config, world);
  // Built as a run builds it: under a sharding strategy the model stays described and the strategy fills
  // its chunks (lazy construction), while "none" builds it whole.
  InjectedTask task(make_text_task(config, runtime), {2}, std::numeric_limits<double>::infinity());
  train::Trainer trainer(config, runtime, task);
  const auto summary = trainer.run();
  EXPECT_EQ(summary.skipped_steps, 1) << strategy;
}

// Weights within 2e-5 and Adam's moments within 1e-4 of their own size: float32, only the order of the
// sums differs (reduce-scatter vs all-reduce, norms added piece by piece). The moments are small, so
// they are compared relative to themselves: a gradient average off by a factor shows there.
void sharded_training_equals_plain_data_parallel(const fs::path& root, const std::shared_ptr<dist::World>& world) {
  train_with(root, "plain", "none", world);
  for (const std::string strategy : {"zero1", "zero2", "gemini"}) {
    train_with(root, strategy, strategy, world);
    if (world->rank() != 0) continue;
    expect_same_tensors(saved(root, strategy, "model.safetensors"), saved(root, "plain", "model.safetensors"), 2e-5,
                        1.0, strategy + " weights");
    expect_same_tensors(saved(root, strategy, "optimizer.safetensors"),
                        saved(root, "plain", "optimizer.safetensors"), 1e-4, 0.0, strategy + " optimizer state");
  }
}

TEST_F(GPTMemoryTest, ShardingOnOneRankEqualsPlainTraining) {
  sharded_training_equals_plain_data_parallel(root_, dist::World::single());
}

TEST_F(GPTMemoryTest, ShardingOnTwoRanksEqualsPlainDataParallel) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  sharded_training_equals_plain_data_parallel(root_, testing::worker_world());
}

TEST_F(GPTMemoryTest, ShardingOnFourRanksEqualsPlainDataParallel) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  sharded_training_equals_plain_data_parallel(root_, testing::worker_world());
}

// A ZeRO-2 checkpoint written by 2 ranks after 3 of 6 steps holds whole tensors: it resumes on 4 ranks
// (Gemini) and on 1 (ZeRO-1), and both finish equal to 6 uninterrupted serial steps (2e-5: float32 sums).
const std::string kResharding = "train.batch_size=16\ntrain.micro_batch_size=2\ndist.timeout_s=30\n"
                                "train.checkpoint_interval=3\nmemory.chunk_mb=0.00390625";

void resume_and_compare(const fs::path& root, const std::string& name, const std::string& strategy,
                        const std::shared_ptr<dist::World>& world) {
  const fs::path out = root / name;
  if (world->rank() == 0) {
    fs::create_directories(out);
    fs::copy(root / "written_on_2" / "checkpoints", out / "checkpoints", fs::copy_options::recursive);
  }
  dist::barrier(*world->world_group());
  const auto config = make_config(root, name, kResharding + "\nmemory.strategy=\"" + strategy + "\"");
  train::Runtime runtime = train::start_runtime(config, world);
  auto task = make_text_task(config);
  train::Trainer trainer(config, runtime, *task);
  EXPECT_EQ(trainer.start_step(), 3);
  trainer.run();
  if (world->rank() != 0) return;
  train_serially(make_config(root, "serial_" + name, kResharding));
  expect_same_tensors(saved(root, name, "model.safetensors"), saved(root, "serial_" + name, "model.safetensors"), 2e-5,
                      1.0, name);
}

TEST_F(GPTMemoryTest, ShardedCheckpointFromTwoRanksResumesOnOneAndFour) {
  if (!testing::is_worker()) {
    testing::run_test_on_ranks(2, 120, {{"KUAFU_TEST_PHASE", "write"}});
    testing::run_test_on_ranks(4, 180, {{"KUAFU_TEST_PHASE", "resume"}});
    resume_and_compare(root_, "resumed_on_1", "zero1", dist::World::single());
    return;
  }
  const auto world = testing::worker_world();
  if (std::string(std::getenv("KUAFU_TEST_PHASE")) == "write") {
    const auto config = make_config(root_, "written_on_2", kResharding + "\ntrain.steps=3\nmemory.strategy=\"zero2\"");
    train::Runtime runtime = train::start_runtime(config, world);
    auto task = make_text_task(config);
    train::Trainer(config, runtime, *task).run();
  } else {
    resume_and_compare(root_, "resumed_on_4", "gemini", world);
  }
}

// Gemini on 2 ranks in float64 with chunks of 1,024 elements, one micro-step of 2 rows per rank: only
// some chunks are whole at any moment (the peak stays below the whole model), every chunk is released
// after backward with each tensor back in FREE, and each rank's gradient pieces equal the serial
// gradient of all 4 rows (1e-12: float64, summation order only).
TEST_F(GPTMemoryTest, GeminiGathersChunksAroundBlocksAndReleasesThem) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 60);
  const auto world = testing::worker_world();
  const auto config = make_config(root_, "direct", "");
  auto build = [&] {
    torch::manual_seed(5);
    GPT model(model_config(config));
    model->to(torch::kFloat64);
    return model;
  };
  GPT model = build();
  GPT serial = build();
  torch::manual_seed(9);
  const torch::Tensor tokens = torch::randint(64, {4, 16}, torch::kInt64);
  const torch::Tensor targets = torch::randint(64, {4, 16}, torch::kInt64);
  const int rank = world->rank();

  memory::Gemini gemini(*model, world->world_group(), {1024, torch::kFloat64, {}});
  train::ParallelModel runner(*model, {});
  runner.set_block_hooks(&gemini);
  int64_t whole_model_bytes = 0;
  for (int64_t c = 0; c < gemini.layout().num_chunks(); ++c) whole_model_bytes += gemini.layout().chunk_numel(c) * 8;
  ASSERT_GT(gemini.layout().num_chunks(), 4);
  gemini.begin_backward(/*sync=*/true);
  runner.loss({tokens.narrow(0, 2 * rank, 2), targets.narrow(0, 2 * rank, 2)}).backward();
  gemini.finish_backward();
  EXPECT_EQ(gemini.fast_bytes_held(), gemini.ledger().model_bytes(memory::Tier::kFast));
  EXPECT_GT(gemini.peak_gathered_bytes(), 0);
  EXPECT_LT(gemini.peak_gathered_bytes(), whole_model_bytes);
  EXPECT_EQ(gemini.gathered_bytes(), 0);
  for (int64_t i = 0; i < gemini.layout().num_tensors(); ++i) EXPECT_EQ(gemini.state(i), memory::TensorState::kFree);

  serial->loss(tokens, targets).backward();
  const auto serial_params = serial->named_parameters();
  for (const auto& piece : gemini.params()) {
    const torch::Tensor expected = gemini.piece_of(piece.name, serial_params[piece.name].grad());
    ASSERT_EQ(piece.tensor.grad().numel(), expected.numel()) << piece.name;
    if (expected.numel() == 0) continue;
    EXPECT_LT((piece.tensor.grad() - expected).abs().max().item<double>(), 1e-12) << piece.name;
  }
}

// The ledger is what the budgets trust: after every micro-step of auto placement (chunks kept, evicted
// and prefetched, masters moved to the device by the margin) and of static placement, the device bytes it
// counts equal those of the tensors Gemini holds there, the accounted peak stays within the budget, and
// masters moved to the other tier leave nothing behind (a view of the old shard would keep it alive).
TEST_F(GPTMemoryTest, GeminiLedgerMatchesTheTensorsItHolds) {
  const auto config = make_config(root_, "ledger", "model.n_layer=4");
  torch::manual_seed(9);
  const torch::Tensor tokens = torch::randint(64, {2, 17}, torch::kInt64);
  for (const bool auto_policy : {true, false}) {
    torch::manual_seed(5);
    GPT model(model_config(config));
    memory::GeminiOptions options{1024, torch::kBFloat16, {}};
    options.placement.auto_policy = auto_policy;
    options.placement.margin_ratio = auto_policy ? 0.5 : 0.0;
    options.placement.offload_param_fraction = auto_policy ? 0.0 : 0.5;
    options.placement.offload_optim_fraction = auto_policy ? 0.0 : 0.5;
    // Room for the traced activations: under LibTorch 2.11 the auto policy's warm-up traces 8.4 MiB at
    // most (activations_peak_mb; static placement 0.3 MiB, LibTorch 1.13 under 4 MiB), most of it one
    // host allocation made inside the first traced blocks that this test does not control.
    options.placement.budgets.fast_bytes = 16 << 20;
    memory::Gemini gemini(*model, dist::World::single()->world_group(), options);
    gemini.account_optimizer_state(2);
    train::ParallelModel runner(*model, {});
    runner.set_block_hooks(&gemini);
    // The masters' storage now, to see that what a move to the other tier leaves behind is freed.
    std::vector<std::pair<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>>> first_storage;
    for (const auto& piece : gemini.params()) {
      first_storage.emplace_back(piece.tensor.storage().unsafeGetStorageImpl(), piece.tensor.storage().getWeakStorageImpl());
    }
    for (int step = 0; step < 3; ++step) {
      gemini.begin_backward(/*sync=*/true);
      runner.loss({tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16)}).backward();
      gemini.finish_backward();
      EXPECT_EQ(gemini.fast_bytes_held(), gemini.ledger().model_bytes(memory::Tier::kFast)) << step;
      gemini.copy_masters_to_model();
      gemini.zero_grad();
    }
    EXPECT_LE(gemini.ledger().peak_bytes(memory::Tier::kFast), options.placement.budgets.fast_bytes);
    int64_t moved = 0;
    for (size_t k = 0; k < first_storage.size(); ++k) {
      if (gemini.params()[k].tensor.storage().unsafeGetStorageImpl() == first_storage[k].first) continue;
      ++moved;
      EXPECT_TRUE(first_storage[k].second.expired()) << gemini.params()[k].name << ": its old masters are still held";
    }
    if (auto_policy) {
      EXPECT_GT(gemini.prefetches(), 0);
      EXPECT_EQ(gemini.master_tier(0), memory::Tier::kFast);  // the margin took the masters
      EXPECT_GT(moved, 0);
    }
  }
}

// The moving average of the weights (optim.ema_decay) is one more float32 tensor per master element, on its
// master's tier, and Gemini's ledger counts it there (it was left out unless the disk tier held it). With every
// compute shard and master chunk in host memory, the host holds per element the bf16 shard (2 bytes) and the
// master, gradient and Adam's two moments (16): 18 bytes, and 22 with the average. Chunks are counted whole,
// so the ratio is exact up to the figures' double rounding.
TEST_F(GPTMemoryTest, GeminiCountsTheMovingAverageWithItsMasters) {
  const std::string offloaded =
      "train.batch_size=16\ntrain.micro_batch_size=2\nprecision.dtype=\"bf16\"\nprecision.loss_scale=\"dynamic\"\n"
      "precision.initial_scale=1024\nprecision.hysteresis=1\nmemory.chunk_mb=0.00390625\nmemory.strategy=\"gemini\"\n"
      "memory.offload_param_fraction=1\nmemory.offload_optim_fraction=1";
  const auto host_peak_mb = [&](const std::string& run, const std::string& extra) {
    train_with_an_overflow(root_, run, offloaded + "\n" + extra, dist::World::single());
    const nlohmann::json figures = testing::last_line_with(root_ / run / "metrics.jsonl", "host_peak_mb");
    EXPECT_FALSE(figures.is_null()) << run;
    return figures.value("host_peak_mb", 0.0);
  };
  const double plain = host_peak_mb("without_average", "");
  const double averaged = host_peak_mb("with_average", "optim.ema_decay=0.9");
  ASSERT_GT(plain, 0);
  EXPECT_NEAR(averaged / plain, 22.0 / 18.0, 1e-9) << averaged << " MiB against " << plain;
}

}  // namespace
}  // namespace kuafu::gpt

// Gemini's placement through the trainer, from the config alone, on 1, 2 and 4 Gloo ranks (bf16, a
// 4-layer GPT, gradient accumulation, a dynamic loss scale that skips an overflowed step):
// - static fractions and the auto policy under a device budget that forces evictions take exactly the
//   steps of Gemini without placement (moving a chunk between tiers copies it, nothing is rounded);
// - the device tier's accounted peak (model data plus traced activations) never exceeds its budget, and
//   under auto the masters that a host budget cannot hold are stepped on the device;
// - both stay close to plain data parallelism in bf16;
// - a checkpoint written under auto placement resumes under static placement and ends the same;
// - a budget too small for one block stops the run with an error naming the key.
#include <gtest/gtest.h>

#include <limits>

#include "tests/apps/gpt/gpt_training_support.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::gpt {
namespace {

class GPTPlacementTest : public GPTTrainingTest {};

// 16 rows per step as micro-batches of 2; step 3 overflows. Chunks of 4 KiB (2,048 bf16 elements), so
// the larger matrices get chunks of their own and the model has many chunks to place.
const std::string kPlaced =
    "train.batch_size=16\ntrain.micro_batch_size=2\ndist.timeout_s=30\nprecision.dtype=\"bf16\"\n"
    "precision.loss_scale=\"dynamic\"\nprecision.initial_scale=1024\nprecision.hysteresis=1\noptim.grad_clip=0\n"
    "model.n_embd=64\nmodel.n_layer=4\nmodel.n_head=4\nmemory.chunk_mb=0.00390625";

// Trains run `name` with the extra overrides (6 steps unless they say otherwise; `skipped` overflowed
// steps expected); returns the last metrics line, read on every rank from rank 0's file.
nlohmann::json train_placed(const fs::path& root, const std::string& name, const std::string& extra,
                            const std::shared_ptr<dist::World>& world, int64_t skipped = 1) {
  const auto lines = train_with_an_overflow(root, name, kPlaced + "\n" + extra, world, skipped);
  return lines.empty() ? nlohmann::json::object() : lines.back();
}

void placement_keeps_the_steps(const fs::path& root, const std::shared_ptr<dist::World>& world) {
  const std::string gemini = "memory.strategy=\"gemini\"";
  train_placed(root, "plain", "memory.strategy=\"none\"", world);
  train_placed(root, "gemini", gemini, world);
  train_placed(root, "static", gemini + "\nmemory.offload_param_fraction=0.5\nmemory.offload_optim_fraction=0.5", world);
  // Auto with no budget keeps every chunk on the device after warm-up: the whole model, the gradients of
  // the chunks in backward and the activations. The budget below holds the activations' peak (measured
  // the same in every run: the allocations are deterministic) and 70% of the chunks: enough for any one
  // block (a layer is a fifth of the model, twice that in backward with its gradients), too little to
  // keep them all, so chunks are evicted every micro-step.
  const nlohmann::json free = train_placed(root, "auto_unlimited", gemini + "\nmemory.placement=\"auto\"", world);
  const double chunks_mb = free["chunks_mb"].get<double>();
  const double activations_mb = free["activations_peak_mb"].get<double>();
  const double budget_mb = activations_mb + 0.7 * chunks_mb;
  ASSERT_LT(budget_mb, free["device_peak_mb"].get<double>()) << "the budget would not force evictions";
  const nlohmann::json tight = train_placed(
      root, "auto_budget",
      gemini + "\nmemory.placement=\"auto\"\nmemory.margin_ratio=0.5\nmemory.device_budget_mb=" + std::to_string(budget_mb),
      world);
  // A host budget of 60% of what auto keeps there: the masters that do not fit are stepped on the device.
  const double host_mb = 0.6 * free["host_peak_mb"].get<double>();
  const nlohmann::json host_full = train_placed(
      root, "auto_host_full", gemini + "\nmemory.placement=\"auto\"\nmemory.host_budget_mb=" + std::to_string(host_mb),
      world);
  // A checkpoint written after 3 steps under auto placement resumes under static placement (chunks and
  // masters on other tiers) and ends where the unplaced run ends.
  train_placed(root, "written_auto", gemini + "\nmemory.placement=\"auto\"\ntrain.steps=3", world);
  if (world->rank() == 0) {
    fs::create_directories(root / "resumed_static");
    fs::copy(root / "written_auto" / "checkpoints", root / "resumed_static" / "checkpoints", fs::copy_options::recursive);
  }
  dist::barrier(*world->world_group());
  train_placed(root, "resumed_static", gemini + "\nmemory.offload_param_fraction=0.5\nmemory.offload_optim_fraction=0.5",
               world, /*skipped=*/0);
  if (world->rank() != 0) return;
  EXPECT_LE(host_full["host_peak_mb"].get<double>(), host_mb);
  EXPECT_GT(host_full["master_chunks_on_device"].get<double>(), 0);
  EXPECT_LE(tight["device_peak_mb"].get<double>(), budget_mb);
  EXPECT_GT(tight["evictions"].get<double>(), 0);
  EXPECT_GT(tight["master_chunks_on_device"].get<double>(), 0);  // the margin took some masters
  // Placement only copies bf16 chunks and float32 masters between tiers: the same bits as without it.
  for (const std::string run : {"static", "auto_unlimited", "auto_budget", "auto_host_full", "resumed_static"}) expect_same_run(root, run, "gemini", 0.0);
  // bf16 Gemini against plain bf16 data parallelism. Both accumulate and average the gradients in float32
  // (precision.grad_reduce = "float32"), so only the order of float32 sums differs: 5e-10 measured at
  // weights of size ~0.1-1. 1e-6 of each tensor's largest weight leaves a margin of ~1,000 for Adam's
  // amplification of such differences and fails where a gradient is wrong (plain training that
  // accumulated in bf16 .grad was 7e-3 away).
  expect_same_tensors(saved(root, "gemini", "model.safetensors"), saved(root, "plain", "model.safetensors"), 1e-6, 1e-2,
                      "gemini bf16 vs plain bf16 weights");
}

TEST_F(GPTPlacementTest, PlacementOnOneRankKeepsTheStepsAndTheBudget) {
  placement_keeps_the_steps(root_, dist::World::single());
}

TEST_F(GPTPlacementTest, PlacementOnTwoRanksKeepsTheStepsAndTheBudget) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 240);
  placement_keeps_the_steps(root_, testing::worker_world());
}

TEST_F(GPTPlacementTest, PlacementOnFourRanksKeepsTheStepsAndTheBudget) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 300);
  placement_keeps_the_steps(root_, testing::worker_world());
}

TEST_F(GPTPlacementTest, BudgetTooSmallForOneBlockIsAnErrorNamingTheKey) {
  const auto config = make_config(root_, "too_small",
                                  kPlaced + "\nmemory.strategy=\"gemini\"\nmemory.device_budget_mb=0.01\n"
                                            "memory.placement=\"auto\"");
  auto runtime = single_runtime();
  auto task = make_text_task(config);
  const std::string message = testing::error_message([&] { train::Trainer(config, runtime, *task).run(); });
  EXPECT_NE(message.find("memory.device_budget_mb"), std::string::npos) << message;
}

TEST_F(GPTPlacementTest, PlacementKeysNeedGeminiAndLowPrecision) {
  auto runtime = single_runtime();
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"memory.strategy=\"zero2\"\nmemory.placement=\"auto\"\nprecision.dtype=\"bf16\"", "memory.placement"},
      {"memory.strategy=\"gemini\"\nmemory.offload_optim_fraction=0.5", "memory.offload_optim_fraction"},
      {"memory.strategy=\"gemini\"\nprecision.dtype=\"bf16\"\nmemory.placement=\"auto\"\nmemory.offload_param_fraction=0.5",
       "memory.offload_param_fraction"},
      {"memory.strategy=\"gemini\"\nprecision.dtype=\"bf16\"\nmemory.margin_ratio=0.5", "memory.margin_ratio"}};
  for (const auto& [extra, key] : refused) {
    const auto config = make_config(root_, "refused", extra);
    auto task = make_text_task(config);
    const std::string message = testing::error_message([&] { train::Trainer(config, runtime, *task); });
    EXPECT_NE(message.find(key), std::string::npos) << extra << "\n" << message;
  }
}

}  // namespace
}  // namespace kuafu::gpt

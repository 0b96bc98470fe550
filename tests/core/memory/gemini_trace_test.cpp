// Gemini's warm-up trace measures what a block needs while it computes, not only what is left when it
// returns: a temporary the block frees before returning counts towards the device budget. With several
// ranks every rank takes the largest measurement, so a budget one rank's block overflows stops every
// rank with the budget's error instead of leaving the others waiting in the next gather.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "core/memory/gemini.h"
#include "core/hooks/block_hooks.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::memory {
namespace {

constexpr int64_t kScratchBytes = 32 << 20;

// Two linear blocks; the first holds a scratch tensor of `scratch_bytes` while it computes and frees it
// before returning (as a large intermediate of an attention or a loss would be). It is held long
// enough (100 ms) for the CPU's sampling meter (every 2 ms) to see it under any load.
struct TwoBlocks : torch::nn::Module {
  TwoBlocks() {
    first = register_module("first", torch::nn::Linear(32, 32));
    second = register_module("second", torch::nn::Linear(32, 32));
  }

  // `inside`: called in the first block while it computes.
  torch::Tensor forward(hooks::BlockHooks* hooks, const torch::Tensor& input, int64_t scratch_bytes,
                        const std::function<void()>& inside = nullptr) {
    const torch::Tensor hidden = hooks::run_block(hooks, {"first", {first.get()}}, input, [&](const torch::Tensor& x) {
      const torch::Tensor scratch = torch::ones({scratch_bytes / 4 + 1});  // float32, filled: its pages are real
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (inside) inside();
      return first(x) * (scratch[0].item<float>());  // the scratch is gone when the block returns
    });
    return hooks::run_block(hooks, {"second", {second.get()}}, hidden,
                         [&](const torch::Tensor& x) { return second(x); });
  }

  torch::nn::Linear first{nullptr}, second{nullptr};
};

GeminiOptions auto_placement(int64_t device_budget_bytes) {
  GeminiOptions options{256, torch::kBFloat16, {}};
  options.placement.auto_policy = true;
  options.placement.budgets.fast_bytes = device_budget_bytes;
  return options;
}

// One warm-up micro-step (forward and backward) with `scratch_bytes` in the first block.
void warm_up(Gemini& gemini, TwoBlocks& model, int64_t scratch_bytes) {
  torch::manual_seed(3);
  const torch::Tensor input = torch::randn({4, 32}).to(torch::kBFloat16).requires_grad_();  // Gemini's dtype
  gemini.begin_backward(/*sync=*/true);
  model.forward(&gemini, input, scratch_bytes).sum().backward();
  gemini.finish_backward();
}

TEST(GeminiTraceTest, ATemporaryFreedInsideABlockCountsTowardsTheDeviceBudget) {
  {
    TwoBlocks model;
    Gemini gemini(model, dist::World::single()->world_group(), auto_placement(0));
    warm_up(gemini, model, kScratchBytes);
    ASSERT_TRUE(gemini.warmed_up());
    // Sampled only at the block's edges, the trace would hold about nothing: the scratch is freed by then.
    EXPECT_GE(gemini.ledger().peak_non_model_bytes(), kScratchBytes);
    EXPECT_LT(gemini.ledger().peak_non_model_bytes(), 2 * kScratchBytes);
  }
  TwoBlocks model;
  Gemini gemini(model, dist::World::single()->world_group(), auto_placement(kScratchBytes / 2));
  const std::string message = testing::error_message([&] { warm_up(gemini, model, kScratchBytes); });
  EXPECT_TRUE(testing::Contains(message, "memory.device_budget_mb")) << message;
  EXPECT_TRUE(testing::Contains(message, "block call 'first/fwd'")) << message;
}

// A forward without gradient (recycling's iterations before the last) is traced apart from the trained
// forward, so a step with another number of them still plans each call by its own kind. The warm-up runs
// the first block once without gradient (no scratch) and once with (the scratch); later steps run it with
// gradient only, or three times without first: while it computes, the ledger holds the traced scratch for
// the trained call and not for the others. (Keyed by block name alone, the trained call of the second step
// took the untrained one's place in the trace, and its figure.)
TEST(GeminiTraceTest, ForwardsWithoutGradientAreTracedApart) {
  TwoBlocks model;
  Gemini gemini(model, dist::World::single()->world_group(), auto_placement(int64_t{1} << 34));  // tracked, never binding
  torch::manual_seed(3);
  const torch::Tensor input = torch::randn({4, 32}).to(torch::kBFloat16).requires_grad_();
  int64_t trained = 0, untrained = 0;  // the non-model bytes planned while the first block computed
  const auto step = [&](int untrained_passes) {
    gemini.begin_backward(/*sync=*/true);
    for (int i = 0; i < untrained_passes; ++i) {
      torch::NoGradGuard no_grad;
      model.forward(&gemini, input, 0, [&] { untrained = std::max(untrained, gemini.ledger().non_model_bytes()); });
    }
    model.forward(&gemini, input, kScratchBytes, [&] { trained = gemini.ledger().non_model_bytes(); }).sum().backward();
    gemini.finish_backward();
  };
  step(1);
  ASSERT_TRUE(gemini.warmed_up());
  for (int passes : {0, 3}) {
    trained = untrained = 0;
    step(passes);
    EXPECT_GE(trained, kScratchBytes) << passes << " passes without gradient first";
    EXPECT_LT(untrained, kScratchBytes / 2) << passes << " passes without gradient first";
  }
}

// Only rank 0's block makes the scratch: rank 1 measures nothing, yet takes rank 0's figure, and both
// stop at the same block when the budget cannot hold it.
TEST(GeminiTraceTest, EveryRankTakesTheLargestMeasurementAndStopsTogether) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 60);
  const auto world = testing::worker_world();
  const int64_t scratch = world->rank() == 0 ? kScratchBytes : 0;
  {
    TwoBlocks model;
    Gemini gemini(model, world->world_group(), auto_placement(0));
    warm_up(gemini, model, scratch);
    EXPECT_GE(gemini.ledger().peak_non_model_bytes(), kScratchBytes) << "rank " << world->rank();
  }
  TwoBlocks model;
  Gemini gemini(model, world->world_group(), auto_placement(kScratchBytes / 2));
  const auto started = std::chrono::steady_clock::now();
  const std::string message = testing::error_message([&] { warm_up(gemini, model, scratch); });
  EXPECT_TRUE(testing::Contains(message, "block call 'first/fwd'")) << "rank " << world->rank() << ": " << message;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20))
      << "rank " << world->rank() << " waited for the collective timeout";
}

}  // namespace
}  // namespace kuafu::memory

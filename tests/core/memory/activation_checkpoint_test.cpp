// Activation checkpointing against the block run plainly, in float64 with dropout: the same output,
// the same gradients for the input and the parameters (exactly: the recomputation repeats the same
// operations on the same values, dropout masks included), the body run twice, no graph kept through the
// block between forward and backward, and the random stream left where the plain run leaves it.
#include <gtest/gtest.h>

#include <torch/csrc/autograd/variable.h>

#include "core/memory/activation_checkpoint.h"
#include "tests/support/devices.h"

namespace kuafu::memory {
namespace {

// On each device: the recomputation replays that device's random generator (the CPU's, or the GPU's).
TEST(ActivationCheckpointTest, RecomputedBlockGivesThePlainGradientsAndReplaysDropout) {
  for (const torch::Device& device : testing::devices_to_test()) {
    SCOPED_TRACE(device.str());
    torch::manual_seed(1);
    torch::nn::Linear linear(8, 8);
    linear->to(device, torch::kFloat64);
    const torch::Tensor input = torch::randn({4, 8}, torch::TensorOptions(torch::kFloat64).device(device));
    int calls = 0;
    auto body = [&](const torch::Tensor& x) {
      ++calls;
      return torch::dropout(torch::tanh(linear(x)), 0.5, /*train=*/true) * x;
    };
    auto run = [&](bool recompute) {
      linear->zero_grad();
      torch::Tensor x = input.clone().requires_grad_(true);
      torch::manual_seed(2);  // seeds every device's generator
      torch::Tensor y = recompute ? checkpointed(x, body) : body(x);
      (y * y).sum().backward();
      const double next_draw = torch::rand({1}, x.options().requires_grad(false)).item<double>();
      return std::make_tuple(y.detach(), x.grad(), linear->weight.grad().clone(), linear->bias.grad().clone(),
                             next_draw);
    };
    const auto [y0, dx0, dw0, db0, draw0] = run(false);
    calls = 0;
    const auto [y1, dx1, dw1, db1, draw1] = run(true);
    EXPECT_EQ(calls, 2) << "one forward without a graph, one recomputation in backward";
    EXPECT_TRUE(torch::equal(y1, y0));
    EXPECT_TRUE(torch::equal(dx1, dx0));
    EXPECT_TRUE(torch::equal(dw1, dw0));
    EXPECT_TRUE(torch::equal(db1, db0));
    EXPECT_EQ(draw1, draw0) << "the recomputation puts the random stream back";
  }
}

TEST(ActivationCheckpointTest, TheForwardKeepsNoGraphInsideTheBlock) {
  torch::Tensor x = torch::randn({3}, torch::kFloat64).requires_grad_(true);
  torch::Tensor y = checkpointed(x, [](const torch::Tensor& in) { return (in * 2).exp(); });
  ASSERT_TRUE(y.grad_fn());
  // The output's backward node leads straight to the input: nothing of `* 2` or `exp` was recorded.
  ASSERT_EQ(y.grad_fn()->next_edges().size(), 1u);
  EXPECT_EQ(y.grad_fn()->next_edges()[0].function.get(), torch::autograd::impl::grad_accumulator(x).get())
      << y.grad_fn()->name();
  y.sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), 2 * (x * 2).exp()));
  // Without gradient mode it is the block itself.
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(checkpointed(x, [](const torch::Tensor& in) { return in + 1; }).requires_grad());
}

}  // namespace
}  // namespace kuafu::memory

// Bucketed data parallelism over real Gloo ranks against the serial full-batch gradient, with the
// buckets made small so several all-reduces overlap backward. float64 so equality is to 1e-12. And in
// bf16/fp16: gradients accumulate and are averaged in float32 (or, as an option, pre-divided in fp16).
#include <gtest/gtest.h>

#include "core/hooks/grad_ready.h"
#include "core/parallel/data/data_parallel.h"
#include "tests/support/gradient_sums.h"
#include "tests/support/multiprocess.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

torch::nn::Sequential make_model(int seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                              torch::nn::Tanh(), torch::nn::Linear(16, 3));
  model->to(torch::kFloat64);
  return model;
}

torch::Tensor loss_of(torch::nn::Sequential& model, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::mse_loss(model->forward(x), y);
}

TEST(DataParallelTest, BucketedGradientsEqualSerialFullBatch) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  auto world = testing::worker_world();
  const int p = world->size(), r = world->rank();
  torch::manual_seed(7);
  const torch::Tensor x = torch::randn({8, 6}, torch::kFloat64);
  const torch::Tensor y = torch::randn({8, 3}, torch::kFloat64);

  auto serial = make_model(1);
  loss_of(serial, x, y).backward();

  // Different seeds per rank: the constructor must broadcast rank 0's weights.
  auto model = make_model(r == 0 ? 1 : 99);
  parallel::DataParallel ddp(*model, world->world_group(), {/*bucket_bytes=*/512});
  EXPECT_GT(ddp.num_buckets(), 2);
  for (int step = 0; step < 2; ++step) {  // twice: buckets must reset between backward passes
    ddp.zero_grad();
    ddp.begin_backward(/*sync=*/true);
    loss_of(model, x.chunk(p, 0)[r], y.chunk(p, 0)[r]).backward();
    ddp.finish_backward();
  }
  auto expected = serial->parameters();
  auto actual = model->parameters();
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::allclose(actual[i], expected[i], 0, 0)) << "weights differ at " << i;
    EXPECT_TRUE(torch::allclose(actual[i].grad(), expected[i].grad(), 1e-12, 1e-12)) << "gradient " << i;
  }
}

TEST(DataParallelTest, AccumulationWithoutSyncEqualsLargeBatch) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  auto world = testing::worker_world();
  const int p = world->size(), r = world->rank();
  torch::manual_seed(8);
  const torch::Tensor x = torch::randn({8, 6}, torch::kFloat64);
  const torch::Tensor y = torch::randn({8, 3}, torch::kFloat64);
  auto serial = make_model(2);
  loss_of(serial, x, y).backward();

  auto model = make_model(2);
  parallel::DataParallel ddp(*model, world->world_group(), {/*bucket_bytes=*/1024});
  const int64_t sent_before = world->world_group()->counters().bytes_sent;
  // Two micro-steps of 2 rows per rank; global rows ordered micro-major like the trainer's.
  for (int micro = 0; micro < 2; ++micro) {
    ddp.begin_backward(/*sync=*/micro == 1);
    const int64_t first = micro * 2 * p + r * 2;
    (loss_of(model, x.narrow(0, first, 2), y.narrow(0, first, 2)) / 2.0).backward();
    if (micro == 0) {
      EXPECT_EQ(world->world_group()->counters().bytes_sent, sent_before) << "micro-step communicated";
    }
  }
  ddp.finish_backward();
  auto expected = serial->parameters();
  auto actual = model->parameters();
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::allclose(actual[i].grad(), expected[i].grad(), 1e-12, 1e-12)) << "gradient " << i;
  }
}

// A bf16 model: 2 ranks x 8 micro-steps of 4 rows, with a random weighting of the outputs so that the
// gradients differ in sign and size between micro-steps (what makes low-precision sums lose bits).
torch::nn::Sequential make_bf16_model() {
  auto model = make_model(3);
  model->to(torch::kBFloat16);
  return model;
}

TEST(DataParallelTest, Bf16GradientsAccumulateAndAverageInFloat32) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  auto world = testing::worker_world();
  const int p = world->size(), r = world->rank();
  constexpr int64_t kMicroSteps = 8, kRows = 4;
  torch::manual_seed(12);
  const torch::Tensor x = torch::randn({kMicroSteps * p * kRows, 6}).to(torch::kBFloat16);
  const torch::Tensor weighting = torch::randn({kMicroSteps * p * kRows, 3}).to(torch::kBFloat16);
  // Rows of micro-step m on rank q, micro-major as the trainer orders them.
  auto loss_of_rows = [&](torch::nn::Sequential& model, int64_t micro, int64_t rank) {
    const int64_t first = (micro * p + rank) * kRows;
    return (model->forward(x.narrow(0, first, kRows)) * weighting.narrow(0, first, kRows)).sum();
  };
  // Every rank's per-micro-step bf16 gradients, summed exactly: the reference average.
  auto reference = make_bf16_model();
  const testing::GradientSums expected = testing::gradient_sums(*reference, kMicroSteps * p, p, [&](int64_t k) {
    return loss_of_rows(reference, k / p, k % p);
  });

  auto model = make_bf16_model();
  parallel::DataParallel ddp(*model, world->world_group(), {/*bucket_bytes=*/512});
  EXPECT_GT(ddp.num_buckets(), 2);
  ddp.zero_grad();
  for (int64_t micro = 0; micro < kMicroSteps; ++micro) {
    ddp.begin_backward(/*sync=*/micro + 1 == kMicroSteps);
    loss_of_rows(model, micro, r).backward();
  }
  ddp.finish_backward();
  // At most 8 additions per rank and one across the ranks, each rounding by 2^-24 of the summed
  // magnitudes in float32: below 6e-7 of them. Accumulating or reducing in bf16 errs near 2^-9 (2e-3).
  constexpr double kFloat32Sums = 1e-6;
  for (const auto& [name, grad] : ddp.grads()) {
    const double error = testing::error_in_magnitudes(grad, expected.sum.at(name), expected.magnitude.at(name));
    EXPECT_LT(error, kFloat32Sums) << name << " on rank " << r;
    EXPECT_EQ(grad.scalar_type(), torch::kFloat32) << name;
    const torch::Tensor& param = model->named_parameters()[name];
    EXPECT_FALSE(param.grad().defined()) << name << " kept a bf16 .grad";
    EXPECT_TRUE(hooks::grad_of(param).is_same(grad)) << name << ": the parameter does not lead to its main gradient";
  }
}

// One fp16 parameter whose gradient on each of 2 ranks is 40,000: the sum, 80,000, exceeds fp16's
// largest value (65,504), the average does not. Float32 main gradients hold the sum; with
// grad_reduce = kCompute the gradient stays fp16 and is halved before the sum. 40,000 and 20,000 are
// exact in fp16, so the result must be exactly 40,000.
TEST(DataParallelTest, Fp16GradientsNearTheLimitAverageWithoutOverflow) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  auto world = testing::worker_world();
  for (const auto mode : {optim::GradReduce::kFloat32, optim::GradReduce::kCompute}) {
    torch::nn::Module model;
    torch::Tensor weight = model.register_parameter("weight", torch::zeros({4}, torch::kHalf));
    parallel::DataParallel ddp(model, world->world_group(), {/*bucket_bytes=*/25 << 20, mode});
    ddp.begin_backward(/*sync=*/true);
    torch::autograd::backward({weight}, {torch::full({4}, 40000.0, torch::kHalf)});
    ddp.finish_backward();
    const torch::Tensor grad = ddp.grads().front().second;
    const bool compute = mode == optim::GradReduce::kCompute;
    EXPECT_EQ(grad.scalar_type(), compute ? torch::kHalf : torch::kFloat32);
    EXPECT_TRUE(torch::equal(grad.to(torch::kFloat64), torch::full({4}, 40000.0, torch::kFloat64)))
        << (compute ? "compute" : "float32") << ": " << grad;
  }
}

}  // namespace
}  // namespace kuafu

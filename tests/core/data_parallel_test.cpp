// Bucketed data parallelism over real Gloo ranks against the serial full-batch gradient, with the
// buckets made small so several all-reduces overlap backward. float64 so equality is to 1e-12.
#include <gtest/gtest.h>

#include "core/parallel/data/data_parallel.h"
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
  parallel::DataParallel ddp(*model, world->world_group(), /*bucket_bytes=*/512);
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
  parallel::DataParallel ddp(*model, world->world_group(), /*bucket_bytes=*/1024);
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

}  // namespace
}  // namespace kuafu

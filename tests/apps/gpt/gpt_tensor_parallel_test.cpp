// GPT under each tensor-parallel mode (1D on 2 and 4 ranks, 2D on 2 x 2, 2.5D on 2 x 2 x 2, 3D on
// 2 x 2 x 2) over real Gloo ranks against the serial GPT built from the same seed: the initial
// weights are the serial ones cut into blocks, and the loss, the full logits and every parameter's
// gradient agree. float64 (the model is cast after initialisation), tolerance 1e-10: only summation
// order differs, over a two-layer model.
#include <gtest/gtest.h>

#include "apps/gpt/model.h"
#include "tests/apps/gpt/gpt_tiny_config.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::gpt {
namespace {

void tensor_parallel_gpt_equals_serial(parallel::TensorMode mode, int depth = 1) {
  auto world = testing::worker_world();
  parallel::TensorParallel tp;
  tp.spec = {mode, world->size(), depth};
  tp.mesh = std::make_shared<dist::ProcessMesh>(world, parallel::tensor_mesh_axes(tp.spec));

  torch::manual_seed(5);
  GPT serial(tiny_parallel_gpt_config());
  torch::manual_seed(5);
  GPT parallel_model(tiny_parallel_gpt_config(), tp);
  serial->to(torch::kFloat64);
  parallel_model->to(torch::kFloat64);

  torch::manual_seed(6);
  // 4 rows: the 2D grid cuts them into 2 row blocks, 2.5D into d q = 4 and 3D into q^2 = 4.
  const torch::Tensor tokens = torch::randint(64, {4, 12}), targets = torch::randint(64, {4, 12});
  torch::Tensor serial_loss = serial->loss(tokens, targets);
  serial_loss.backward();
  torch::Tensor parallel_loss = parallel_model->loss(tokens, targets);
  parallel_loss.backward();
  EXPECT_NEAR(parallel_loss.item<double>(), serial_loss.item<double>(), 1e-10);

  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(parallel_model->forward(tokens), serial->forward(tokens), 1e-10, 1e-10));
  const auto layouts = parallel::collect_layouts(*parallel_model);
  if (mode == parallel::TensorMode::k1D) {
    EXPECT_EQ(layouts.size(), 2u * 8u + 1u) << "c_attn, c_proj (attn), c_fc, c_proj (mlp): weight + bias each, and wte";
  } else {
    EXPECT_EQ(layouts.size(), parallel_model->named_parameters().size()) << "2D, 2.5D and 3D cut every parameter";
  }
  const auto expected = serial->named_parameters();
  for (const auto& item : parallel_model->named_parameters()) {
    const auto layout = layouts.find(item.key());
    const parallel::Layout cut = layout == layouts.end() ? parallel::Layout{} : layout->second;
    const torch::Tensor& reference = expected[item.key()];
    EXPECT_TRUE(torch::equal(item.value(), parallel::shard_of(reference, cut, *tp.mesh)))
        << item.key() << ": initial block differs from the serial weights on rank " << world->rank() << ", max "
        << (item.value() - parallel::shard_of(reference, cut, *tp.mesh)).abs().max().item<double>();
    const torch::Tensor grad = parallel::shard_of(reference.grad(), cut, *tp.mesh);
    EXPECT_TRUE(torch::allclose(item.value().grad(), grad, 1e-10, 1e-10))
        << item.key() << " gradient, rank " << world->rank() << ": max difference "
        << (item.value().grad() - grad).abs().max().item<double>();
  }
}

TEST(GPTTensorParallelTest, OneDimensionalOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  tensor_parallel_gpt_equals_serial(parallel::TensorMode::k1D);
}

TEST(GPTTensorParallelTest, OneDimensionalOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  tensor_parallel_gpt_equals_serial(parallel::TensorMode::k1D);
}

TEST(GPTTensorParallelTest, TwoDimensionalOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  tensor_parallel_gpt_equals_serial(parallel::TensorMode::k2D);
}

TEST(GPTTensorParallelTest, TwoAndAHalfDimensionalOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 120);
  tensor_parallel_gpt_equals_serial(parallel::TensorMode::k2p5D, /*depth=*/2);
}

TEST(GPTTensorParallelTest, ThreeDimensionalOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 120);
  tensor_parallel_gpt_equals_serial(parallel::TensorMode::k3D);
}

// A model the mode cannot cut says which sizes clash.
TEST(GPTTensorParallelTest, HeadsThatDoNotDivideNameTheMode) {
  parallel::TensorParallel tp;
  tp.spec = {parallel::TensorMode::k1D, 3, 1};
  tp.mesh = std::make_shared<dist::ProcessMesh>(dist::World::single(), std::vector<dist::MeshAxis>{{"tensor", 1}});
  const std::string message = testing::error_message([&] { GPT model(tiny_parallel_gpt_config(), tp); });
  EXPECT_TRUE(testing::Contains(message, "model.n_head (4)"));
  EXPECT_TRUE(testing::Contains(message, "parallel.tensor.mode = \"1d\""));
}

}  // namespace
}  // namespace kuafu::gpt

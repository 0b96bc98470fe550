// 3D tensor parallelism over real Gloo ranks (a 2 x 2 x 2 cube, 8 processes) against the serial
// layers, in float64. The 3D layers form the same products and sums as the serial ones, only grouped
// differently (per-block partial sums, then sums over ranks), so they agree to summation-order
// rounding: 1e-12 on values of order 1-10. Checked: outputs, input gradients and every parameter
// gradient (as shard_of of the serial gradient) for Linear3d in both weight orders, from both sides
// and with a q|k|v stride, a Linear -> gelu -> Linear -> LayerNorm chain that returns to its input
// side, the token embedding with its tied output layer and loss, and the errors for meshes and specs
// the cube cannot lay out.
#include <gtest/gtest.h>

#include "core/parallel/tensor/layers_3d.h"
#include "tests/support/multiprocess.h"
#include "tests/support/tensor_parallel_checks.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

using parallel::Layout;
using parallel::Side3d;
using parallel::WeightOrder;

constexpr int kCubeSide = 2;  // q: 8 ranks
constexpr int kCubeRanks = kCubeSide * kCubeSide * kCubeSide;
constexpr int kTimeout = 120;

// One world per worker process (a second rendezvous in the same process cannot bind the port), so
// each test builds its mesh once and passes it on.
std::shared_ptr<dist::ProcessMesh> cube_mesh() {
  return std::make_shared<dist::ProcessMesh>(
      testing::worker_world(),
      std::vector<dist::MeshAxis>{{"tp_x", kCubeSide}, {"tp_y", kCubeSide}, {"tp_z", kCubeSide}});
}

using testing::expect_close;

using Param = testing::BoundParam;
using testing::bind_param;
using testing::randn64;
using testing::serial_linear;
using testing::weight_of;

using testing::expect_gradients;

TEST(Layers3dTest, ActivationBlocksSplitAndGatherBack) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kCubeRanks, kTimeout);
  auto mesh = cube_mesh();
  const int a = mesh->coordinate("tp_x"), b = mesh->coordinate("tp_y"), c = mesh->coordinate("tp_z");
  EXPECT_EQ(parallel::cube_side_3d(*mesh), kCubeSide);
  const torch::Tensor full = torch::arange(8 * 3 * 4, torch::kFloat64).reshape({8, 3, 4});
  // Side Y: rank (a, b, c) holds batch rows block 2a + c (2 rows) and features block b.
  const torch::Tensor y_block = parallel::split_activation_3d(full, *mesh, Side3d::kY);
  EXPECT_TRUE(torch::equal(y_block, full.narrow(0, 2 * (2 * a + c), 2).narrow(2, 2 * b, 2)));
  EXPECT_TRUE(torch::equal(parallel::gather_activation_3d(y_block, *mesh, Side3d::kY), full));
  // Side X: batch rows block 2b + c and features block a.
  const torch::Tensor x_block = parallel::split_activation_3d(full, *mesh, Side3d::kX);
  EXPECT_TRUE(torch::equal(x_block, full.narrow(0, 2 * (2 * b + c), 2).narrow(2, 2 * a, 2)));
  EXPECT_TRUE(torch::equal(parallel::gather_activation_3d(x_block, *mesh, Side3d::kX), full));
}

// Y = X A + b, loss = <Y, R>, against the serial layer; X on `side`, Y on the other side.
void linear_equals_serial(const dist::ProcessMesh& mesh, WeightOrder order, bool bias, Side3d side,
                          const std::vector<int64_t>& x_shape, bool input_grad, int64_t stride = 1) {
  const parallel::LinearSpec spec{x_shape.back(), 6 * stride, bias, order, stride};
  parallel::Linear3d layer(spec, mesh, side);
  ASSERT_EQ(layer->output_side(), parallel::other_side(side));
  const auto dims = static_cast<int64_t>(x_shape.size());
  // The output's features are cut per stride segment (q|k|v), like the weight's columns.
  testing::linear_equals_serial(layer, spec, parallel::activation_layout_3d(dims, side),
                                testing::per_segment(parallel::activation_layout_3d(dims, parallel::other_side(side)), stride),
                                mesh, x_shape, input_grad, testing::kFloat64Tolerance);
}

TEST(Linear3dTest, EqualsSerialInBothWeightOrdersFromBothSides) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kCubeRanks, kTimeout);
  auto mesh = cube_mesh();
  for (const Side3d side : {Side3d::kY, Side3d::kX}) {
    SCOPED_TRACE(side == Side3d::kY ? "input on side Y" : "input on side X");
    linear_equals_serial(*mesh, WeightOrder::kInOut, /*bias=*/true, side, {8, 3, 8}, /*input_grad=*/true);
    linear_equals_serial(*mesh, WeightOrder::kOutIn, /*bias=*/true, side, {8, 3, 8}, /*input_grad=*/true);
    linear_equals_serial(*mesh, WeightOrder::kOutIn, /*bias=*/true, side, {12, 4}, /*input_grad=*/true);
    // First layer of a model: no input gradient is wanted, so backward skips its half of the work.
    linear_equals_serial(*mesh, WeightOrder::kInOut, /*bias=*/false, side, {4, 2, 2, 8}, /*input_grad=*/false);
  }
  // A fused q|k|v projection: each rank's output block is its block of every segment.
  linear_equals_serial(*mesh, WeightOrder::kInOut, /*bias=*/true, Side3d::kY, {8, 3, 8}, /*input_grad=*/true,
                       /*stride=*/3);
}

TEST(Layers3dTest, TiedEmbeddingLogitsAndLossEqualSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kCubeRanks, kTimeout);
  auto mesh = cube_mesh();
  parallel::Embedding3d embedding(10, 8, *mesh);
  testing::tied_embedding_equals_serial(*embedding, embedding->parameter_layouts().at("weight"), *mesh, 8, testing::kFloat64Tolerance);
}

// Z = LayerNorm(gelu(X A1 + b1) A2 + b2) with random gain and bias, loss = <Z, R>. fc1 takes side Y to
// side X, fc2 takes it back, so Z is on X's side and the LayerNorm works there.
TEST(Layers3dTest, LinearGeluLinearLayerNormEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kCubeRanks, kTimeout);
  auto mesh = cube_mesh();
  const int64_t in = 8, hidden = 12, out = 8;
  const double eps = 1e-5;
  torch::manual_seed(11);
  const torch::Tensor w1 = weight_of(in, hidden, WeightOrder::kInOut), b1 = randn64({hidden});
  const torch::Tensor w2 = weight_of(hidden, out, WeightOrder::kOutIn), b2 = randn64({out});
  const torch::Tensor gain = 1 + 0.5 * randn64({out}), shift = randn64({out});
  const torch::Tensor x0 = randn64({8, 3, in}), r = randn64({8, 3, out});

  parallel::Linear3d fc1(parallel::LinearSpec{in, hidden, true, WeightOrder::kInOut, 1}, *mesh, Side3d::kY);
  parallel::Linear3d fc2(parallel::LinearSpec{hidden, out, true, WeightOrder::kOutIn, 1}, *mesh, fc1->output_side());
  parallel::LayerNorm3d norm(out, *mesh, fc2->output_side(), eps);
  ASSERT_EQ(fc2->output_side(), Side3d::kY);
  fc1->to(torch::kFloat64);
  fc2->to(torch::kFloat64);
  norm->to(torch::kFloat64);
  const auto l1 = fc1->parameter_layouts(), l2 = fc2->parameter_layouts(), ln = norm->parameter_layouts();
  const std::vector<Param> params = {
      bind_param("fc1.weight", w1, fc1->weight, l1.at("weight"), *mesh),
      bind_param("fc1.bias", b1, fc1->bias, l1.at("bias"), *mesh),
      bind_param("fc2.weight", w2, fc2->weight, l2.at("weight"), *mesh),
      bind_param("fc2.bias", b2, fc2->bias, l2.at("bias"), *mesh),
      bind_param("norm.weight", gain, norm->weight, ln.at("weight"), *mesh),
      bind_param("norm.bias", shift, norm->bias, ln.at("bias"), *mesh)};

  torch::Tensor xs = x0.clone().requires_grad_();
  torch::Tensor hs = torch::gelu(serial_linear(xs, params[0].serial, params[1].serial, WeightOrder::kInOut));
  torch::Tensor zs = torch::layer_norm(serial_linear(hs, params[2].serial, params[3].serial, WeightOrder::kOutIn),
                                       {out}, params[4].serial, params[5].serial, eps);
  (zs * r).sum().backward();

  torch::Tensor xp = parallel::split_activation_3d(x0, *mesh, Side3d::kY).requires_grad_();
  torch::Tensor hp = torch::gelu(fc1(xp));
  expect_close(hp, parallel::split_activation_3d(hs, *mesh, Side3d::kX), "hidden block");
  torch::Tensor zp = norm(fc2(hp));
  (zp * parallel::split_activation_3d(r, *mesh, Side3d::kY)).sum().backward();

  expect_close(zp, parallel::split_activation_3d(zs, *mesh, Side3d::kY), "output block");
  expect_close(xp.grad(), parallel::split_activation_3d(xs.grad(), *mesh, Side3d::kY), "input gradient block");
  expect_gradients(params, *mesh);
}

TEST(Layers3dTest, MeshesAndSpecsTheCubeCannotLayOutGiveClearErrors) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kCubeRanks, kTimeout);
  auto mesh = cube_mesh();
  auto linear = [&](int64_t in, int64_t out, int64_t stride) {
    parallel::Linear3d(parallel::LinearSpec{in, out, true, WeightOrder::kInOut, stride}, *mesh);
  };
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { linear(8, 9, 3); }), "per stride segment 3"));
  const std::string in = testing::expected_error([&] { linear(6, 4, 1); });  // in must divide by q^2 = 4
  EXPECT_TRUE(testing::Contains(in, "input features 6 is not divisible by 4"));
  EXPECT_TRUE(testing::Contains(in, "q = 2"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { linear(4, 7, 1); }), "output features 7"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parallel::LayerNorm3d(7, *mesh); }), "hidden size 7"));
  // A block of the wrong width is refused before any communication.
  parallel::Linear3d layer(parallel::LinearSpec{8, 4, true, WeightOrder::kInOut, 1}, *mesh);
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { layer(torch::zeros({2, 8})); }), "[B/q^2, ..., 4]"));
  // Batches that do not divide by q^2 cannot be split.
  EXPECT_TRUE(testing::Contains(
      testing::expected_error([&] { parallel::split_activation_3d(torch::zeros({6, 4}), *mesh); }), "divide"));
  // Meshes without a tp_x x tp_y x tp_z cube in that order. (A new first axis keeps the group names
  // apart from the cube above.)
  auto single = dist::World::single();
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] {
    parallel::Linear3d(parallel::LinearSpec{4, 4}, dist::ProcessMesh(single, {{"tensor", 1}}));
  }), "'tp_x', 'tp_y' and 'tp_z'"));
  dist::ProcessMesh flat(mesh->world_ptr(), {{"pipeline", 1}, {"tp_x", 4}, {"tp_y", 2}, {"tp_z", 1}});
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parallel::LayerNorm3d(8, flat); }), "needs a cube"));
  dist::ProcessMesh reversed(mesh->world_ptr(), {{"data", 1}, {"tp_z", 2}, {"tp_y", 2}, {"tp_x", 2}});
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parallel::split_activation_3d(torch::zeros({8, 4}),
                                                                                            reversed); }),
                                "in the order tp_x, tp_y, tp_z"));
}

}  // namespace
}  // namespace kuafu

// 2.5D (Tesseract) tensor parallelism over 8 real Gloo ranks (d = 2 stacked 2 x 2 grids) against the
// serial layers, in float64. Each depth layer runs SUMMA on its own batch rows and the replicated
// weights' gradients are summed over the depth, so every rank must hold the serial full-batch
// gradient of its block (shard_of the serial gradient, the same on both depth layers).
// Values agree to summation-order rounding: 1e-12 on values of order 1-10. Checked: activation
// blocks, GridLinear in both weight orders (with and without bias and input gradient, and with a
// q|k|v stride), a Linear -> gelu -> Linear -> LayerNorm chain, the token embedding with its tied
// output layer and loss, and the errors for meshes and batches 2.5D cannot lay out.
#include <gtest/gtest.h>

#include "core/parallel/tensor/layers_grid.h"
#include "tests/support/multiprocess.h"
#include "tests/support/tensor_parallel_checks.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

using parallel::Layout;
using parallel::WeightOrder;

constexpr double kTolerance = 1e-12;
constexpr int kDepth = 2;     // d
constexpr int kGridSide = 2;  // q: d q^2 = 8 ranks
constexpr int kRanks = kDepth * kGridSide * kGridSide;

// One world per worker process (a second rendezvous in the same process cannot bind the port), so
// each test builds its mesh once and passes it on.
std::shared_ptr<dist::ProcessMesh> tesseract_mesh() {
  return std::make_shared<dist::ProcessMesh>(
      testing::worker_world(),
      std::vector<dist::MeshAxis>{{"tp_dep", kDepth}, {"tp_row", kGridSide}, {"tp_col", kGridSide}});
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what) {
  testing::expect_close(actual, expected, what, kTolerance);
}

using Param = testing::BoundParam;
using testing::bind_param;
using testing::randn64;
using testing::serial_linear;
using testing::weight_of;

void expect_gradients(const std::vector<Param>& params, const dist::ProcessMesh& mesh) {
  testing::expect_gradients(params, mesh, kTolerance);
}

TEST(Layers2p5dTest, ActivationBlocksSplitAndGatherBack) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kRanks, 120);
  auto mesh = tesseract_mesh();
  const int h = mesh->coordinate("tp_dep"), i = mesh->coordinate("tp_row"), j = mesh->coordinate("tp_col");
  const torch::Tensor full = torch::arange(8 * 3 * 6, torch::kFloat64).reshape({8, 3, 6});
  const torch::Tensor block = parallel::split_activation_grid(full, *mesh);
  // Rank (h, i, j): batch rows block h q + i of d q = 4 (2 rows each) and features 3j .. 3j+2.
  EXPECT_TRUE(torch::equal(block, full.narrow(0, 2 * (h * kGridSide + i), 2).narrow(2, 3 * j, 3)));
  EXPECT_TRUE(torch::equal(parallel::gather_activation_grid(block, *mesh), full));
  EXPECT_EQ(parallel::grid_shape(*mesh).q, kGridSide);
  EXPECT_EQ(parallel::grid_shape(*mesh).d, kDepth);
  const torch::Tensor ids = torch::arange(8).reshape({8, 1});
  EXPECT_TRUE(torch::equal(parallel::shard_of(ids, parallel::grid_batch_layout(*mesh), *mesh),
                           ids.narrow(0, 2 * (h * kGridSide + i), 2)));
}

// Y = X A + b, loss = <Y, R>, against the serial layer.
void linear_equals_serial(const dist::ProcessMesh& mesh, WeightOrder order, bool bias,
                          const std::vector<int64_t>& x_shape, bool input_grad, int64_t stride = 1) {
  const int64_t in = x_shape.back(), out = 4 * stride;
  torch::manual_seed(7);
  const torch::Tensor w = weight_of(in, out, order), b = randn64({out});
  const torch::Tensor x0 = randn64(x_shape);
  std::vector<int64_t> y_shape = x_shape;
  y_shape.back() = out;
  const torch::Tensor r = randn64(y_shape);

  parallel::GridLinear layer(parallel::LinearSpec{in, out, bias, order, stride}, mesh);
  layer->to(torch::kFloat64);
  const auto layouts = layer->parameter_layouts();
  std::vector<Param> params = {bind_param("weight", w, layer->weight, layouts.at("weight"), mesh)};
  if (bias) params.push_back(bind_param("bias", b, layer->bias, layouts.at("bias"), mesh));

  torch::Tensor xs = x0.clone().requires_grad_(input_grad);
  torch::Tensor ys = serial_linear(xs, params[0].serial, bias ? params[1].serial : torch::Tensor(), order);
  (ys * r).sum().backward();

  torch::Tensor xp = parallel::split_activation_grid(x0, mesh).requires_grad_(input_grad);
  torch::Tensor yp = layer(xp);
  // The output's features are cut per stride segment (q|k|v), like the weight's columns.
  auto output_layout = [&](const torch::Tensor& t) {
    Layout layout = parallel::grid_activation_layout(t.dim(), mesh);
    layout.back().stride = stride;
    return layout;
  };
  (yp * parallel::shard_of(r, output_layout(r), mesh)).sum().backward();

  expect_close(yp, parallel::shard_of(ys, output_layout(ys), mesh), "output block");
  expect_close(parallel::gather_full(yp.detach(), output_layout(yp), mesh), ys.detach(), "gathered output");
  if (input_grad) expect_close(xp.grad(), parallel::split_activation_grid(xs.grad(), mesh), "input gradient block");
  expect_gradients(params, mesh);
}

TEST(Linear2p5dTest, EqualsSerialInBothWeightOrders) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kRanks, 120);
  auto mesh = tesseract_mesh();
  linear_equals_serial(*mesh, WeightOrder::kInOut, /*bias=*/true, {8, 3, 6}, /*input_grad=*/true);
  linear_equals_serial(*mesh, WeightOrder::kOutIn, /*bias=*/true, {8, 3, 6}, /*input_grad=*/true);
  linear_equals_serial(*mesh, WeightOrder::kOutIn, /*bias=*/true, {12, 8}, /*input_grad=*/true);
  // First layer of a model: no input gradient is wanted.
  linear_equals_serial(*mesh, WeightOrder::kInOut, /*bias=*/false, {4, 2, 2, 6}, /*input_grad=*/false);
  linear_equals_serial(*mesh, WeightOrder::kInOut, /*bias=*/true, {8, 3, 6}, /*input_grad=*/true, /*stride=*/3);
}

TEST(Layers2p5dTest, TiedEmbeddingLogitsAndLossEqualSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kRanks, 120);
  auto mesh = tesseract_mesh();
  parallel::GridEmbedding embedding(10, 6, *mesh);
  testing::tied_embedding_equals_serial(*embedding, embedding->parameter_layouts().at("weight"), *mesh, 8, kTolerance);
}

// Z = LayerNorm(gelu(X A1 + b1) A2 + b2) with random gain and bias, loss = <Z, R>.
TEST(Layers2p5dTest, LinearGeluLinearLayerNormEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kRanks, 120);
  auto mesh_ptr = tesseract_mesh();
  const dist::ProcessMesh& mesh = *mesh_ptr;
  const int64_t in = 6, hidden = 8, out = 6;
  const double eps = 1e-5;
  torch::manual_seed(11);
  const torch::Tensor w1 = weight_of(in, hidden, WeightOrder::kInOut), b1 = randn64({hidden});
  const torch::Tensor w2 = weight_of(hidden, out, WeightOrder::kOutIn), b2 = randn64({out});
  const torch::Tensor gain = 1 + 0.5 * randn64({out}), shift = randn64({out});
  const torch::Tensor x0 = randn64({8, 3, in}), r = randn64({8, 3, out});

  parallel::GridLinear fc1(parallel::LinearSpec{in, hidden, true, WeightOrder::kInOut, 1}, mesh);
  parallel::GridLinear fc2(parallel::LinearSpec{hidden, out, true, WeightOrder::kOutIn, 1}, mesh);
  parallel::GridLayerNorm norm(out, mesh, eps);
  fc1->to(torch::kFloat64);
  fc2->to(torch::kFloat64);
  norm->to(torch::kFloat64);
  const auto l1 = fc1->parameter_layouts(), l2 = fc2->parameter_layouts(), ln = norm->parameter_layouts();
  const std::vector<Param> params = {
      bind_param("fc1.weight", w1, fc1->weight, l1.at("weight"), mesh),
      bind_param("fc1.bias", b1, fc1->bias, l1.at("bias"), mesh),
      bind_param("fc2.weight", w2, fc2->weight, l2.at("weight"), mesh),
      bind_param("fc2.bias", b2, fc2->bias, l2.at("bias"), mesh),
      bind_param("norm.weight", gain, norm->weight, ln.at("weight"), mesh),
      bind_param("norm.bias", shift, norm->bias, ln.at("bias"), mesh)};

  torch::Tensor xs = x0.clone().requires_grad_();
  torch::Tensor hs = torch::gelu(serial_linear(xs, params[0].serial, params[1].serial, WeightOrder::kInOut));
  torch::Tensor zs = torch::layer_norm(serial_linear(hs, params[2].serial, params[3].serial, WeightOrder::kOutIn),
                                       {out}, params[4].serial, params[5].serial, eps);
  (zs * r).sum().backward();

  torch::Tensor xp = parallel::split_activation_grid(x0, mesh).requires_grad_();
  torch::Tensor zp = norm(fc2(torch::gelu(fc1(xp))));
  (zp * parallel::split_activation_grid(r, mesh)).sum().backward();

  expect_close(zp, parallel::split_activation_grid(zs, mesh), "output block");
  expect_close(xp.grad(), parallel::split_activation_grid(xs.grad(), mesh), "input gradient block");
  expect_gradients(params, mesh);
}

TEST(Layers2p5dTest, MeshesAndBatchesItCannotLayOutGiveClearErrors) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kRanks, 120);
  auto mesh = tesseract_mesh();
  // A batch that does not divide into d x q = 4 row blocks.
  const std::string batch = testing::expected_error([&] { parallel::split_activation_grid(torch::zeros({6, 4}), *mesh); });
  EXPECT_TRUE(testing::Contains(batch, "batch size 6"));
  EXPECT_TRUE(testing::Contains(batch, "d x q = 2 x 2 = 4"));
  // Specs the grid cannot cut.
  auto linear = [&](int64_t in, int64_t out, int64_t stride) {
    parallel::GridLinear(parallel::LinearSpec{in, out, true, WeightOrder::kInOut, stride}, *mesh);
  };
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { linear(6, 9, 3); }), "per stride segment 3"));
  const std::string in = testing::expected_error([&] { linear(5, 4, 1); });
  EXPECT_TRUE(testing::Contains(in, "input features 5"));
  EXPECT_TRUE(testing::Contains(in, "q = 2"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { linear(4, 7, 1); }), "output features 7"));
  EXPECT_TRUE(
      testing::Contains(testing::expected_error([&] { parallel::GridLayerNorm(7, *mesh); }), "hidden size 7"));
  // A block of the wrong width is refused before any communication.
  parallel::GridLinear layer(parallel::LinearSpec{6, 4, true, WeightOrder::kInOut, 1}, *mesh);
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { layer(torch::zeros({2, 6})); }), "[B/(dq), ..., 3]"));
  // A mesh whose grids are not square.
  dist::ProcessMesh tall(mesh->world_ptr(), {{"pipeline", 1}, {"tp_dep", 2}, {"tp_row", 4}, {"tp_col", 1}});
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parallel::GridLayerNorm(8, tall); }), "square grids"));
}

}  // namespace
}  // namespace kuafu

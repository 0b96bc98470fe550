// 2D (SUMMA) and 2.5D (Tesseract) tensor parallelism, one set of grid layers, over real Gloo ranks
// against the serial layers, in float64. The grid layers form the same products and sums as the
// serial ones, only grouped differently (per-block partial sums, then sums over ranks), so they agree
// to summation-order rounding: 1e-12 on values of order 1-10. Checked, on a 2 x 2 grid (2D, no
// tp_dep axis) and on d = 2 stacked 2 x 2 grids (2.5D, 8 ranks; each grid runs its own batch rows and
// the replicated weights' gradients are summed over the depth): outputs, input gradients and every
// parameter gradient (as shard_of of the serial gradient) for GridLinear in both weight orders and
// with a q|k|v stride, a Linear -> gelu -> Linear -> LayerNorm chain (also on data x 2 x 2),
// GridEmbedding -> GridLayerNorm -> GridLinear head -> grid_cross_entropy, the embedding's tied output
// layer and loss, and the errors for specs, meshes and batches the grids cannot lay out.
#include <gtest/gtest.h>

#include "core/dist/collectives.h"
#include "core/parallel/tensor/layers_grid.h"
#include "tests/support/multiprocess.h"
#include "tests/support/tensor_parallel_checks.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

using parallel::Layout;
using parallel::WeightOrder;

constexpr int kGridSide = 2;  // q: 4 ranks per grid
constexpr int kDepth = 2;     // d for 2.5D: d q^2 = 8 ranks
constexpr int kGridRanks = kDepth * kGridSide * kGridSide;

// One world per worker process (a second rendezvous in the same process cannot bind the port), so
// each test builds its mesh once and passes it on.
std::shared_ptr<dist::ProcessMesh> grid_mesh(int data = 1) {
  std::vector<dist::MeshAxis> axes;
  if (data > 1) axes.push_back({"data", data});
  axes.push_back({"tp_row", kGridSide});
  axes.push_back({"tp_col", kGridSide});
  return std::make_shared<dist::ProcessMesh>(testing::worker_world(), axes);
}

std::shared_ptr<dist::ProcessMesh> tesseract_mesh() {
  return std::make_shared<dist::ProcessMesh>(
      testing::worker_world(),
      std::vector<dist::MeshAxis>{{"tp_dep", kDepth}, {"tp_row", kGridSide}, {"tp_col", kGridSide}});
}

using testing::expect_close;

using Param = testing::BoundParam;
using testing::bind_param;
using testing::randn64;
using testing::serial_linear;
using testing::weight_of;

using testing::expect_gradients;

TEST(Layers2dTest, ActivationBlocksSplitAndGatherBack) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  auto mesh = grid_mesh();
  const int i = mesh->coordinate("tp_row"), j = mesh->coordinate("tp_col");
  const torch::Tensor full = torch::arange(4 * 3 * 6, torch::kFloat64).reshape({4, 3, 6});
  const torch::Tensor block = parallel::split_activation_grid(full, *mesh);
  // Rank (i, j): batch rows 2i, 2i+1 and features 3j .. 3j+2.
  EXPECT_TRUE(torch::equal(block, full.narrow(0, 2 * i, 2).narrow(2, 3 * j, 3)));
  EXPECT_TRUE(torch::equal(parallel::gather_activation_grid(block, *mesh), full));
  EXPECT_EQ(parallel::grid_shape(*mesh).q, kGridSide);
}

// Y = X A + b, loss = <Y, R>, against the serial layer.
void linear_equals_serial(const dist::ProcessMesh& mesh, WeightOrder order, bool bias,
                          const std::vector<int64_t>& x_shape, bool input_grad, int64_t stride = 1) {
  const parallel::LinearSpec spec{x_shape.back(), 4 * stride, bias, order, stride};
  parallel::GridLinear layer(spec, mesh);
  const Layout stream = parallel::grid_activation_layout(static_cast<int64_t>(x_shape.size()), mesh);
  // The output's features are cut per stride segment (q|k|v), like the weight's columns.
  testing::linear_equals_serial(layer, spec, stream, testing::per_segment(stream, stride), mesh, x_shape, input_grad,
                                testing::kFloat64Tolerance);
}

// Both weight orders, a 2-dim input, no input gradient (a model's first layer: backward skips its half
// of the work) and a fused q|k|v projection (each rank's output block is its block of every segment),
// on `rows` batch rows.
void linear_cases(const dist::ProcessMesh& mesh, int64_t rows) {
  linear_equals_serial(mesh, WeightOrder::kInOut, /*bias=*/true, {rows, 3, 6}, /*input_grad=*/true);
  linear_equals_serial(mesh, WeightOrder::kOutIn, /*bias=*/true, {rows, 3, 6}, /*input_grad=*/true);
  linear_equals_serial(mesh, WeightOrder::kOutIn, /*bias=*/true, {rows + rows / 2, 8}, /*input_grad=*/true);
  linear_equals_serial(mesh, WeightOrder::kInOut, /*bias=*/false, {4, 2, 2, 6}, /*input_grad=*/false);
  linear_equals_serial(mesh, WeightOrder::kInOut, /*bias=*/true, {rows, 3, 6}, /*input_grad=*/true, /*stride=*/3);
}

TEST(Linear2dTest, EqualsSerialInBothWeightOrders) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  linear_cases(*grid_mesh(), 4);
}

// Z = LayerNorm(gelu(X A1 + b1) A2 + b2) with random gain and bias, loss = <Z, R>.
void chain_equals_serial(const dist::ProcessMesh& mesh, int batch_seed) {
  const int64_t in = 6, hidden = 8, out = 6;
  const double eps = 1e-5;
  torch::manual_seed(11);  // the same weights on every data replica
  const torch::Tensor w1 = weight_of(in, hidden, WeightOrder::kInOut), b1 = randn64({hidden});
  const torch::Tensor w2 = weight_of(hidden, out, WeightOrder::kOutIn), b2 = randn64({out});
  const torch::Tensor gain = 1 + 0.5 * randn64({out}), shift = randn64({out});
  torch::manual_seed(batch_seed);
  const torch::Tensor x0 = randn64({4, 3, in}), r = randn64({4, 3, out});

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

TEST(Layers2dTest, LinearGeluLinearLayerNormEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  chain_equals_serial(*grid_mesh(), /*batch_seed=*/21);
}

// data x tp_row x tp_col = 2 x 2 x 2: each data replica runs its own batch on its own grid and must
// match the serial run of that batch (gradients before any data-parallel averaging).
TEST(Layers2dTest, TensorTimesDataParallelOnEightRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8);
  auto mesh = grid_mesh(/*data=*/2);
  chain_equals_serial(*mesh, /*batch_seed=*/21 + mesh->coordinate("data"));
}

// logits = LayerNorm(E[ids]) W^T + c, loss = mean cross-entropy against targets.
TEST(Layers2dTest, EmbeddingHeadAndCrossEntropyEqualSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  auto mesh = grid_mesh();
  const int64_t vocab = 10, hidden = 6;
  torch::manual_seed(5);
  const torch::Tensor table = randn64({vocab, hidden}), w = weight_of(hidden, vocab, WeightOrder::kOutIn);
  const torch::Tensor c = randn64({vocab}), gain = 1 + 0.5 * randn64({hidden}), shift = randn64({hidden});
  const torch::Tensor ids = torch::randint(vocab, {4, 3}), targets = torch::randint(vocab, {4, 3});

  parallel::GridEmbedding embedding(vocab, hidden, *mesh);
  parallel::GridLayerNorm norm(hidden, *mesh);
  parallel::GridLinear head(parallel::LinearSpec{hidden, vocab, true, WeightOrder::kOutIn, 1}, *mesh);
  embedding->to(torch::kFloat64);
  norm->to(torch::kFloat64);
  head->to(torch::kFloat64);
  const auto le = embedding->parameter_layouts(), ln = norm->parameter_layouts(), lh = head->parameter_layouts();
  const std::vector<Param> params = {
      bind_param("embedding", table, embedding->weight, le.at("weight"), *mesh),
      bind_param("norm.weight", gain, norm->weight, ln.at("weight"), *mesh),
      bind_param("norm.bias", shift, norm->bias, ln.at("bias"), *mesh),
      bind_param("head.weight", w, head->weight, lh.at("weight"), *mesh),
      bind_param("head.bias", c, head->bias, lh.at("bias"), *mesh)};

  torch::Tensor hs = torch::layer_norm(torch::embedding(params[0].serial, ids), {hidden}, params[1].serial,
                                       params[2].serial, 1e-5);
  torch::Tensor logits_s = serial_linear(hs, params[3].serial, params[4].serial, WeightOrder::kOutIn);
  torch::Tensor loss_s = torch::nn::functional::cross_entropy(logits_s.reshape({-1, vocab}), targets.reshape({-1}));
  loss_s.backward();

  const auto batch = parallel::grid_batch_layout(*mesh);
  torch::Tensor logits_p = head(norm(embedding(ids)));  // the embedding takes the whole batch
  expect_close(logits_p, parallel::split_activation_grid(logits_s, *mesh), "logits block");
  torch::Tensor loss_p = parallel::grid_cross_entropy(logits_p, parallel::shard_of(targets, batch, *mesh), *mesh);
  loss_p.backward();

  expect_close(loss_p, loss_s, "loss");
  expect_gradients(params, *mesh);
}

TEST(Layers2dTest, TiedEmbeddingLogitsAndLossEqualSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  auto mesh = grid_mesh();
  parallel::GridEmbedding embedding(10, 6, *mesh);
  testing::tied_embedding_equals_serial(*embedding, embedding->parameter_layouts().at("weight"), *mesh, 4, testing::kFloat64Tolerance);
}

// Layer specs a grid with q = 2 cannot cut: a stride segment, input and output features, a LayerNorm.
void specs_the_grid_cannot_cut(const dist::ProcessMesh& mesh) {
  auto linear = [&](int64_t in, int64_t out, int64_t stride) {
    parallel::GridLinear(parallel::LinearSpec{in, out, true, WeightOrder::kInOut, stride}, mesh);
  };
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { linear(6, 9, 3); }), "per stride segment 3"));
  const std::string in = testing::expected_error([&] { linear(5, 4, 1); });
  EXPECT_TRUE(testing::Contains(in, "input features 5"));
  EXPECT_TRUE(testing::Contains(in, "q = 2"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { linear(4, 7, 1); }), "output features 7"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parallel::GridLayerNorm(7, mesh); }), "hidden size 7"));
}

TEST(Layers2dTest, SpecsTheGridCannotLayOutGiveClearErrors) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  auto mesh = grid_mesh();
  specs_the_grid_cannot_cut(*mesh);
  EXPECT_TRUE(
      testing::Contains(testing::expected_error([&] { parallel::GridEmbedding(9, 4, *mesh); }), "vocabulary size 9"));
  // A block of the wrong width is refused before any communication.
  parallel::GridLinear layer(parallel::LinearSpec{6, 4, true, WeightOrder::kInOut, 1}, *mesh);
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { layer(torch::zeros({2, 6})); }), "[B/q, ..., 3]"));
  // Batches that do not divide by q cannot be split.
  EXPECT_TRUE(testing::Contains(
      testing::expected_error([&] { parallel::split_activation_grid(torch::zeros({3, 4}), *mesh); }), "divide"));
  // Meshes without a square tp_row x tp_col grid. (A new first axis keeps the group names apart
  // from the grid above.)
  auto single = dist::World::single();
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] {
    parallel::GridLinear(parallel::LinearSpec{4, 4}, dist::ProcessMesh(single, {{"tensor", 1}}));
  }), "'tp_row' and 'tp_col'"));
  dist::ProcessMesh tall(mesh->world_ptr(), {{"pipeline", 1}, {"tp_row", 4}, {"tp_col", 1}});
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parallel::GridLayerNorm(8, tall); }), "square grid"));
}

// The reduction SUMMA's backward relies on, over the grid's row and column groups.
TEST(Layers2dTest, ReduceToRootAlongGridRowsAndColumns) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  auto mesh = grid_mesh();
  const int i = mesh->coordinate("tp_row"), j = mesh->coordinate("tp_col");
  for (const char* axis : {"tp_row", "tp_col"}) {
    const auto group = mesh->group(axis);
    torch::Tensor t = torch::full({3}, 10.0 * i + j, torch::kFloat64);
    dist::reduce(t, *group, /*root=*/1);
    // Along tp_row the members are (0, j), (1, j); along tp_col (i, 0), (i, 1).
    const double expected = std::string(axis) == "tp_row" ? 10.0 + 2 * j : 20.0 * i + 1;
    if (group->rank() == 1) {
      EXPECT_TRUE(torch::equal(t, torch::full({3}, expected, torch::kFloat64))) << axis;
    }
  }
}

// ---- 2.5D: d = 2 stacked grids ----

TEST(Layers2p5dTest, ActivationBlocksSplitAndGatherBack) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kGridRanks, 120);
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

TEST(Linear2p5dTest, EqualsSerialInBothWeightOrders) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kGridRanks, 120);
  linear_cases(*tesseract_mesh(), 8);
}

TEST(Layers2p5dTest, TiedEmbeddingLogitsAndLossEqualSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kGridRanks, 120);
  auto mesh = tesseract_mesh();
  parallel::GridEmbedding embedding(10, 6, *mesh);
  testing::tied_embedding_equals_serial(*embedding, embedding->parameter_layouts().at("weight"), *mesh, 8, testing::kFloat64Tolerance);
}

// Z = LayerNorm(gelu(X A1 + b1) A2 + b2) with random gain and bias, loss = <Z, R>.
// The chain on 2.5D: 4 batch rows, one per grid row of each depth layer.
TEST(Layers2p5dTest, LinearGeluLinearLayerNormEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kGridRanks, 120);
  chain_equals_serial(*tesseract_mesh(), /*batch_seed=*/21);
}

TEST(Layers2p5dTest, MeshesAndBatchesItCannotLayOutGiveClearErrors) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(kGridRanks, 120);
  auto mesh = tesseract_mesh();
  // A batch that does not divide into d x q = 4 row blocks.
  const std::string batch = testing::expected_error([&] { parallel::split_activation_grid(torch::zeros({6, 4}), *mesh); });
  EXPECT_TRUE(testing::Contains(batch, "batch size 6"));
  EXPECT_TRUE(testing::Contains(batch, "d x q = 2 x 2 = 4"));
  specs_the_grid_cannot_cut(*mesh);
  // A block of the wrong width is refused before any communication.
  parallel::GridLinear layer(parallel::LinearSpec{6, 4, true, WeightOrder::kInOut, 1}, *mesh);
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { layer(torch::zeros({2, 6})); }), "[B/(dq), ..., 3]"));
  // A mesh whose grids are not square.
  dist::ProcessMesh tall(mesh->world_ptr(), {{"pipeline", 1}, {"tp_dep", 2}, {"tp_row", 4}, {"tp_col", 1}});
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parallel::GridLayerNorm(8, tall); }), "square grids"));
}

}  // namespace
}  // namespace kuafu

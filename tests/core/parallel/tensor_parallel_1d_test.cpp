// 1D tensor parallelism over real Gloo ranks against the serial layers, in float64 so that agreement
// is to summation-order rounding (1e-12): the layout's shard/gather round trip, a column -> row MLP
// (outputs and every gradient), the vocabulary-parallel embedding and cross-entropy, and the sizes
// each mode accepts.
#include <gtest/gtest.h>

#include "core/parallel/tensor/linear_1d.h"
#include "core/parallel/tensor/tensor_parallel.h"
#include "core/parallel/tensor/vocab_parallel.h"
#include "tests/support/multiprocess.h"
#include "tests/support/tensor_parallel_checks.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

using parallel::DimSplit;
using parallel::Layout;

std::shared_ptr<dist::ProcessMesh> tensor_mesh() {
  auto world = testing::worker_world();
  return std::make_shared<dist::ProcessMesh>(world, std::vector<dist::MeshAxis>{{"tensor", world->size()}});
}

using testing::expect_close;

void load(torch::Tensor& target, const torch::Tensor& full, const Layout& layout, const dist::ProcessMesh& mesh) {
  testing::load_block(target, full, layout, mesh);
}

TEST(TensorLayoutTest, StridedShardsAndTheirGatherRoundTrip) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  auto mesh = tensor_mesh();
  const int r = mesh->coordinate("tensor");
  // 12 columns as q|k|v segments of 4: rank 0 holds columns 0,1 of each segment, rank 1 columns 2,3.
  const torch::Tensor full = torch::arange(24, torch::kFloat64).reshape({2, 12});
  const Layout qkv = {{1, {"tensor"}, 3}};
  const torch::Tensor shard = parallel::shard_of(full, qkv, *mesh);
  const std::vector<double> row0 = r == 0 ? std::vector<double>{0, 1, 4, 5, 8, 9} : std::vector<double>{2, 3, 6, 7, 10, 11};
  EXPECT_TRUE(torch::equal(shard[0], torch::tensor(row0, torch::kFloat64)));
  EXPECT_TRUE(torch::equal(parallel::gather_full(shard, qkv, *mesh), full));
  // A plain split along the other dimension, and the replicated case.
  const Layout rows = {{0, {"tensor"}, 1}};
  EXPECT_TRUE(torch::equal(parallel::gather_full(parallel::shard_of(full, rows, *mesh), rows, *mesh), full));
  EXPECT_TRUE(torch::equal(parallel::shard_of(full, {}, *mesh), full));
  EXPECT_EQ(parallel::shard_group(rows, *mesh)->size(), 2);
  EXPECT_EQ(parallel::shard_group({}, *mesh), nullptr);
  EXPECT_TRUE(parallel::counts_in_global_norm(rows, {"tensor"}, *mesh));
  EXPECT_EQ(parallel::counts_in_global_norm({}, {"tensor"}, *mesh), r == 0);
  // Sizes that do not divide are refused.
  EXPECT_NE(testing::error_message([&] { parallel::shard_of(torch::zeros({3, 5}), rows, *mesh); }).find("divide"),
            std::string::npos);
}

// y = gelu(x W1 + b1) W2 + b2, loss = <y, R>, with W1 column-parallel and W2 row-parallel (with a
// stride, the row layer takes its input features in the column layer's strided order).
void mlp_equals_serial(const std::shared_ptr<dist::ProcessMesh>& mesh, parallel::WeightOrder order, int64_t stride) {
  const int64_t in = 6, hidden = 12, out = 5;
  torch::manual_seed(3);
  auto full = [&](int64_t a, int64_t b) {
    return order == parallel::WeightOrder::kInOut ? torch::randn({a, b}, torch::kFloat64)
                                                  : torch::randn({b, a}, torch::kFloat64);
  };
  const torch::Tensor w1 = full(in, hidden), b1 = torch::randn({hidden}, torch::kFloat64);
  const torch::Tensor w2 = full(hidden, out), b2 = torch::randn({out}, torch::kFloat64);
  const torch::Tensor x0 = torch::randn({3, 4, in}, torch::kFloat64), r = torch::randn({3, 4, out}, torch::kFloat64);

  // Serial reference.
  auto apply = [&](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
    return testing::serial_linear(x, w, b, order);
  };
  std::vector<torch::Tensor> serial = {w1.clone().requires_grad_(), b1.clone().requires_grad_(),
                                       w2.clone().requires_grad_(), b2.clone().requires_grad_()};
  torch::Tensor xs = x0.clone().requires_grad_();
  torch::Tensor ys = apply(torch::gelu(apply(xs, serial[0], serial[1])), serial[2], serial[3]);
  (ys * r).sum().backward();

  parallel::ColumnParallelLinear column(parallel::LinearSpec{in, hidden, true, order, stride}, *mesh);
  parallel::RowParallelLinear row(parallel::LinearSpec{hidden, out, true, order, stride}, *mesh);
  column->to(torch::kFloat64);
  row->to(torch::kFloat64);
  const auto column_layouts = column->parameter_layouts(), row_layouts = row->parameter_layouts();
  load(column->weight, w1, column_layouts.at("weight"), *mesh);
  load(column->bias, b1, column_layouts.at("bias"), *mesh);
  load(row->weight, w2, row_layouts.at("weight"), *mesh);
  load(row->bias, b2, row_layouts.at("bias"), *mesh);
  torch::Tensor xp = x0.clone().requires_grad_();
  torch::Tensor yp = row(torch::gelu(column(xp)));
  (yp * r).sum().backward();

  expect_close(yp, ys, "output");
  expect_close(xp.grad(), xs.grad(), "input gradient");
  expect_close(column->weight.grad(), parallel::shard_of(serial[0].grad(), column_layouts.at("weight"), *mesh), "W1 grad");
  expect_close(column->bias.grad(), parallel::shard_of(serial[1].grad(), column_layouts.at("bias"), *mesh), "b1 grad");
  expect_close(row->weight.grad(), parallel::shard_of(serial[2].grad(), row_layouts.at("weight"), *mesh), "W2 grad");
  expect_close(row->bias.grad(), serial[3].grad(), "b2 grad");
}

TEST(Linear1dTest, ColumnThenRowEqualsSerialOnTwoRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  auto mesh = tensor_mesh();
  mlp_equals_serial(mesh, parallel::WeightOrder::kInOut, /*stride=*/1);
  mlp_equals_serial(mesh, parallel::WeightOrder::kOutIn, /*stride=*/1);
}

TEST(Linear1dTest, ColumnThenRowEqualsSerialOnFourRanksWithStridedColumns) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  auto mesh = tensor_mesh();
  mlp_equals_serial(mesh, parallel::WeightOrder::kInOut, /*stride=*/3);
  mlp_equals_serial(mesh, parallel::WeightOrder::kOutIn, /*stride=*/1);
}

// Tied embedding and head: h = E[ids]; logits = h E^T; loss = cross-entropy(logits, targets).
// The embedding, its tied output layer (each rank scores its vocabulary rows) and the vocabulary-parallel
// cross-entropy, against E[ids] E^T on one device.
void embedding_and_cross_entropy_equal_serial() {
  auto mesh = tensor_mesh();
  parallel::VocabParallelEmbedding embedding(12, 5, *mesh);
  testing::tied_embedding_equals_serial(*embedding, embedding->parameter_layouts().at("weight"), *mesh, 3, testing::kFloat64Tolerance);
}

TEST(VocabParallelTest, EmbeddingAndCrossEntropyEqualSerialOnTwoAndFourRanks) {
  if (!testing::is_worker()) {
    testing::run_test_on_ranks(2);
    return testing::run_test_on_ranks(4);
  }
  embedding_and_cross_entropy_equal_serial();
}

TEST(TensorParallelSpecTest, EachModeAcceptsItsSizesAndNamesTheKeyOtherwise) {
  config::Schema schema;
  parallel::add_tensor_parallel_schema(schema);
  auto spec = [&](const std::string& toml) {
    return parallel::tensor_parallel_spec(config::Config::from_string(toml, "tp.toml", schema, {}));
  };
  EXPECT_EQ(spec("[parallel.tensor]\nmode = \"2d\"\nsize = 4\n").mode, parallel::TensorMode::k2D);
  EXPECT_EQ(parallel::grid_side(spec("[parallel.tensor]\nmode = \"3d\"\nsize = 8\n")), 2);
  const auto tesseract = spec("[parallel.tensor]\nmode = \"2.5d\"\nsize = 8\ndepth = 2\n");
  EXPECT_EQ(parallel::tensor_axis_names(tesseract), (std::vector<std::string>{"tp_dep", "tp_row", "tp_col"}));
  EXPECT_EQ(parallel::grid_side(tesseract), 2);
  const std::string square = testing::error_message([&] { spec("[parallel.tensor]\nmode = \"2d\"\nsize = 8\n"); });
  EXPECT_TRUE(testing::Contains(square, "parallel.tensor.size"));
  EXPECT_TRUE(testing::Contains(square, "square"));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { spec("[parallel.tensor]\nmode = \"3d\"\nsize = 4\n"); }),
                                "cube"));
  EXPECT_TRUE(testing::Contains(
      testing::error_message([&] { spec("[parallel.tensor]\nmode = \"2.5d\"\nsize = 8\ndepth = 3\n"); }), "depth"));
  EXPECT_TRUE(testing::Contains(
      testing::error_message([&] { spec("[parallel.tensor]\nmode = \"1d\"\nsize = 2\ndepth = 2\n"); }),
      "parallel.tensor.depth"));
}

}  // namespace
}  // namespace kuafu

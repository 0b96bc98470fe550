// The factories in every tensor-parallel mode, on real Gloo ranks against the serial computation in
// float64 (summation order only, 1e-12): a classifier head from make_linear(kColumn) on the residual
// stream's layout, its cross-entropy that never gathers the logits, and the gathered logits. Checked:
// loss, logits, the input's and every parameter's gradient block. And the Llama family's RMSNorms.
#include <gtest/gtest.h>

#include "core/parallel/tensor/factory.h"
#include "tests/support/multiprocess.h"
#include "tests/support/tensor_parallel_checks.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

parallel::TensorParallel mode_on_world(parallel::TensorMode mode, int depth = 1) {
  auto world = testing::worker_world();
  parallel::TensorParallel tp;
  tp.spec = {mode, world->size(), depth};
  tp.mesh = std::make_shared<dist::ProcessMesh>(world, parallel::tensor_mesh_axes(tp.spec));
  return tp;
}

// logits = X W^T + b over 6 classes, mean cross-entropy against targets; X [4, 3, 8].
void classifier_head_equals_serial(const parallel::TensorParallel& tp) {
  const int64_t hidden = 8, classes = 6;
  const dist::ProcessMesh& mesh = *tp.mesh;
  torch::manual_seed(3);
  const torch::Tensor w = testing::randn64({classes, hidden}), b = testing::randn64({classes});
  const torch::Tensor x0 = testing::randn64({4, 3, hidden}), targets = torch::randint(classes, {4, 3});

  torch::nn::AnyModule head = parallel::make_linear({tp}, parallel::LinearSpec{hidden, classes}, parallel::Cut::kColumn);
  head.ptr()->to(torch::kFloat64);
  const auto layouts = parallel::collect_layouts(*head.ptr());  // none when serial
  auto layout_of = [&](const std::string& name) {
    const auto found = layouts.find(name);
    return found == layouts.end() ? parallel::Layout{} : found->second;
  };
  auto params = head.ptr()->named_parameters(/*recurse=*/false);
  const std::vector<testing::BoundParam> bound = {
      testing::bind_param("weight", w, params["weight"], layout_of("weight"), mesh),
      testing::bind_param("bias", b, params["bias"], layout_of("bias"), mesh)};

  torch::Tensor xs = x0.clone().requires_grad_();
  const torch::Tensor logits_s = testing::serial_linear(xs, bound[0].serial, bound[1].serial, parallel::WeightOrder::kOutIn);
  const torch::Tensor loss_s =
      torch::nn::functional::cross_entropy(logits_s.reshape({-1, classes}), targets.reshape({-1}));
  loss_s.backward();

  const parallel::Layout stream = parallel::stream_layout(tp, 3);
  torch::Tensor xp = parallel::shard_of(x0, stream, mesh).requires_grad_();
  const torch::Tensor logits_p = head.forward(xp);
  testing::expect_close(parallel::gather_classifier_logits(tp, logits_p.detach()), logits_s.detach(), "logits",
                        testing::kFloat64Tolerance);
  const torch::Tensor loss_p = parallel::classifier_cross_entropy(tp, logits_p, targets);
  loss_p.backward();
  testing::expect_close(loss_p, loss_s, "loss", testing::kFloat64Tolerance);
  testing::expect_close(xp.grad(), parallel::shard_of(xs.grad(), stream, mesh), "input gradient block", testing::kFloat64Tolerance);
  testing::expect_gradients(bound, mesh, testing::kFloat64Tolerance);
}

// The Llama family's norms on the residual stream's layout, against Llama's formula computed serially in
// float64, loss <Y, R>: make_rms_norm over the stream's 8 features (cut with them in 2D, 2.5D and 3D) and
// make_head_norm over 2 heads of 4 (each rank whole heads of its own rows, or under 1D its own heads of a
// column layer's output; the weight's gradient summed over every rank). Checked: the output block, the input's gradient block and the weight's gradient. Both compute in
// float32 as Llama does: 1e-6.
void rms_norms_equal_serial(const parallel::TensorParallel& tp) {
  const double eps = 1e-6, tolerance = 1e-6;
  const dist::ProcessMesh& mesh = *tp.mesh;
  torch::manual_seed(4);
  const torch::Tensor x0 = testing::randn64({4, 3, 8}), r = testing::randn64({4, 3, 8});
  for (const bool per_head : {false, true}) {
    SCOPED_TRACE(per_head ? "make_head_norm" : "make_rms_norm");
    const int64_t width = per_head ? 4 : 8;
    // The residual stream's layout; a column layer's output for the heads under 1D (its features cut, the
    // stream itself whole on every rank).
    const bool heads_cut_1d = per_head && tp.enabled() && tp.spec.mode == parallel::TensorMode::k1D;
    const parallel::Layout stream = heads_cut_1d ? parallel::Layout{{2, {"tensor"}, 1}} : parallel::stream_layout(tp, 3);
    const torch::Tensor w = testing::randn64({width});
    torch::nn::AnyModule norm = per_head ? parallel::make_head_norm({tp}, width, eps) : parallel::make_rms_norm({tp}, width, eps);
    norm.ptr()->to(torch::kFloat64);
    const auto layouts = parallel::collect_layouts(*norm.ptr());
    auto params = norm.ptr()->named_parameters(/*recurse=*/false);
    const std::vector<testing::BoundParam> bound = {testing::bind_param(
        "weight", w, params["weight"], layouts.count("weight") ? layouts.at("weight") : parallel::Layout{}, mesh)};

    // Serially: y = w x / sqrt(mean(x²) + eps) over each row's (or head's) features.
    torch::Tensor xs = x0.clone().requires_grad_();
    const torch::Tensor grouped = xs.view({4, 3, 8 / width, width});
    const torch::Tensor ys = (bound[0].serial * grouped * torch::rsqrt(grouped.square().mean(-1, true) + eps)).view({4, 3, 8});
    (ys * r).sum().backward();

    torch::Tensor xp = parallel::shard_of(x0, stream, mesh).requires_grad_();
    const std::vector<int64_t> block_heads = {xp.size(0), xp.size(1), xp.size(2) / width, width};
    const torch::Tensor yp = per_head ? norm.forward(xp.view(block_heads)).view(xp.sizes()) : norm.forward(xp);
    testing::expect_close(yp, parallel::shard_of(ys.detach(), stream, mesh), "output block", tolerance);
    (yp * parallel::shard_of(r, stream, mesh)).sum().backward();
    testing::expect_close(xp.grad(), parallel::shard_of(xs.grad(), stream, mesh), "input gradient block", tolerance);
    testing::expect_gradients(bound, mesh, tolerance);
  }
}

TEST(RmsNormTest, OneDimensionalOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  rms_norms_equal_serial(mode_on_world(parallel::TensorMode::k1D));
}

TEST(RmsNormTest, TwoDimensionalOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  rms_norms_equal_serial(mode_on_world(parallel::TensorMode::k2D));
}

TEST(RmsNormTest, TwoAndAHalfDimensionalOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 120);
  rms_norms_equal_serial(mode_on_world(parallel::TensorMode::k2p5D, /*depth=*/2));
}

TEST(RmsNormTest, ThreeDimensionalOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 120);
  rms_norms_equal_serial(mode_on_world(parallel::TensorMode::k3D));
}

TEST(ClassifierHeadTest, OneDimensionalOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  classifier_head_equals_serial(mode_on_world(parallel::TensorMode::k1D));
}

TEST(ClassifierHeadTest, TwoDimensionalOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  classifier_head_equals_serial(mode_on_world(parallel::TensorMode::k2D));
}

TEST(ClassifierHeadTest, TwoAndAHalfDimensionalOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 120);
  classifier_head_equals_serial(mode_on_world(parallel::TensorMode::k2p5D, /*depth=*/2));
}

TEST(ClassifierHeadTest, ThreeDimensionalOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 120);
  classifier_head_equals_serial(mode_on_world(parallel::TensorMode::k3D));
}

TEST(ClassifierHeadTest, SerialIsTorchsCrossEntropy) {
  classifier_head_equals_serial(parallel::TensorParallel{{}, std::make_shared<dist::ProcessMesh>(
                                                                 dist::World::single(),
                                                                 std::vector<dist::MeshAxis>{{"tensor", 1}})});
}

}  // namespace
}  // namespace kuafu

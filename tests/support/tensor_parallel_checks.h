// Checks shared by the tensor-parallel tests: a parallel block against the serial tensor (with the
// largest difference in the message), loading a block of a serial tensor into a parameter, the serial
// linear layer the parallel ones are compared with, and serial/parallel parameter pairs whose
// gradients are compared after backward.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/parallel/tensor/embedding.h"
#include "core/parallel/tensor/layout.h"
#include "core/parallel/tensor/linear_1d.h"

namespace kuafu::testing {

// Float64 on both sides, the same products summed in another order across ranks: rounding alone.
constexpr double kFloat64Tolerance = 1e-12;

inline void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what,
                         double tolerance = kFloat64Tolerance) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(torch::allclose(actual, expected, tolerance, tolerance))
      << what << ": max difference " << (actual - expected).abs().max().item<double>();
}

// target <- this rank's block of `full` under `layout`.
inline void load_block(torch::Tensor& target, const torch::Tensor& full, const parallel::Layout& layout,
                       const dist::ProcessMesh& mesh) {
  torch::NoGradGuard no_grad;
  target.copy_(parallel::shard_of(full, layout, mesh));
}

inline torch::Tensor randn64(at::IntArrayRef shape) { return torch::randn(shape, torch::kFloat64); }

// A random float64 weight in storage order for `in` -> `out` features.
inline torch::Tensor weight_of(int64_t in, int64_t out, parallel::WeightOrder order) {
  return order == parallel::WeightOrder::kInOut ? randn64({in, out}) : randn64({out, in});
}

// The serial reference: x W (+ b) with W stored as `order` says.
inline torch::Tensor serial_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                   parallel::WeightOrder order) {
  torch::Tensor y = order == parallel::WeightOrder::kInOut ? torch::matmul(x, w) : torch::matmul(x, w.t());
  return b.defined() ? y + b : y;
}

// A parameter of the serial model and the parallel layer's parameter cut from it; after backward the
// local gradient must be the serial gradient's block.
struct BoundParam {
  std::string what;
  torch::Tensor serial;  // full, requires grad
  torch::Tensor* local;  // the parallel layer's block
  parallel::Layout layout;
};

// Loads this rank's block of `full` into `local` and returns the pair.
inline BoundParam bind_param(const std::string& what, const torch::Tensor& full, torch::Tensor& local,
                             const parallel::Layout& layout, const dist::ProcessMesh& mesh) {
  load_block(local, full, layout, mesh);
  return {what, full.clone().requires_grad_(), &local, layout};
}

inline void expect_gradients(const std::vector<BoundParam>& params, const dist::ProcessMesh& mesh,
                             double tolerance = kFloat64Tolerance) {
  for (const auto& p : params) {
    expect_close(p.local->grad(), parallel::shard_of(p.serial.grad(), p.layout, mesh), p.what + " gradient", tolerance);
  }
}

// `layout` with its last split cut per stride segment: the features of a q|k|v output.
inline parallel::Layout per_segment(parallel::Layout layout, int64_t stride) {
  layout.back().stride = stride;
  return layout;
}

// Y = X A + b, loss = <Y, R>, for any mode's linear layer (members weight, bias, parameter_layouts()
// and forward, built from `spec`) against the serial product. X [x_shape] enters cut by `in_layout`,
// Y leaves cut by `out_layout` (both for x_shape's number of dims). Checks the output block, the
// gathered output, the input gradient block (when `input_grad`) and the parameter gradients.
template <typename Layer>
void linear_equals_serial(Layer& layer, const parallel::LinearSpec& spec, const parallel::Layout& in_layout,
                          const parallel::Layout& out_layout, const dist::ProcessMesh& mesh,
                          const std::vector<int64_t>& x_shape, bool input_grad, double tolerance) {
  torch::manual_seed(7);
  const torch::Tensor w = weight_of(spec.in, spec.out, spec.order), b = randn64({spec.out});
  const torch::Tensor x0 = randn64(x_shape);
  std::vector<int64_t> y_shape = x_shape;
  y_shape.back() = spec.out;
  const torch::Tensor r = randn64(y_shape);

  layer->to(torch::kFloat64);
  const auto layouts = layer->parameter_layouts();
  std::vector<BoundParam> params = {bind_param("weight", w, layer->weight, layouts.at("weight"), mesh)};
  if (spec.bias) params.push_back(bind_param("bias", b, layer->bias, layouts.at("bias"), mesh));

  torch::Tensor xs = x0.clone().requires_grad_(input_grad);
  torch::Tensor ys = serial_linear(xs, params[0].serial, spec.bias ? params[1].serial : torch::Tensor(), spec.order);
  (ys * r).sum().backward();

  torch::Tensor xp = parallel::shard_of(x0, in_layout, mesh).requires_grad_(input_grad);
  torch::Tensor yp = layer(xp);
  (yp * parallel::shard_of(r, out_layout, mesh)).sum().backward();

  expect_close(yp, parallel::shard_of(ys, out_layout, mesh), "output block", tolerance);
  expect_close(parallel::gather_full(yp.detach(), out_layout, mesh), ys.detach(), "gathered output", tolerance);
  if (input_grad) {
    expect_close(xp.grad(), parallel::shard_of(xs.grad(), in_layout, mesh), "input gradient block", tolerance);
  }
  expect_gradients(params, mesh, tolerance);
}

// Any mode's token embedding with its tied output layer against the serial table: logits = E[ids] E^T
// and their mean cross-entropy, so E's gradient has both a lookup and an output-layer part. Checks the
// gathered logits, the loss and this rank's gradient block. Every rank passes the same whole batch.
inline void tied_embedding_equals_serial(parallel::TokenEmbeddingImpl& embedding, const parallel::Layout& layout,
                                         const dist::ProcessMesh& mesh, int64_t batch, double tolerance) {
  embedding.to(torch::kFloat64);
  torch::Tensor weight = embedding.named_parameters(/*recurse=*/false)["weight"];
  const std::vector<int64_t> full = parallel::gather_full(weight.detach(), layout, mesh).sizes().vec();  // [V, H]
  torch::manual_seed(5);
  const torch::Tensor table = randn64({full[0], full[1]});
  const torch::Tensor ids = torch::randint(full[0], {batch, 3}), targets = torch::randint(full[0], {batch, 3});
  const BoundParam param = bind_param("embedding", table, weight, layout, mesh);

  const torch::Tensor logits_s = torch::matmul(torch::embedding(param.serial, ids), param.serial.t());
  const torch::Tensor loss_s =
      torch::nn::functional::cross_entropy(logits_s.reshape({-1, full[0]}), targets.reshape({-1}));
  loss_s.backward();

  const torch::Tensor logits_p = embedding.logits(embedding.forward(ids));
  expect_close(embedding.gather_logits(logits_p.detach()), logits_s.detach(), "gathered logits", tolerance);
  const torch::Tensor loss_p = embedding.cross_entropy(logits_p, targets);
  loss_p.backward();
  expect_close(loss_p, loss_s, "loss", tolerance);
  expect_gradients({param}, mesh, tolerance);

  // Ignored targets (kIgnoredTarget): every target of row 0 and one of row 1, so row blocks hold
  // different numbers of learned tokens. PyTorch's ignore_index mean is the reference.
  weight.mutable_grad() = torch::Tensor();
  torch::Tensor masked = targets.clone();
  masked[0].fill_(parallel::kIgnoredTarget);
  masked[1][2] = parallel::kIgnoredTarget;
  const BoundParam again = bind_param("embedding (ignored targets)", table, weight, layout, mesh);
  const torch::Tensor logits_m = torch::matmul(torch::embedding(again.serial, ids), again.serial.t());
  const torch::Tensor loss_m = torch::nn::functional::cross_entropy(
      logits_m.reshape({-1, full[0]}), masked.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(parallel::kIgnoredTarget));
  loss_m.backward();
  const torch::Tensor loss_pm = embedding.cross_entropy(embedding.logits(embedding.forward(ids)), masked);
  loss_pm.backward();
  expect_close(loss_pm, loss_m, "loss with ignored targets", tolerance);
  expect_gradients({again}, mesh, tolerance);

  // No learned target at all: a loss of exactly 0 and zero gradients, not torch's 0/0.
  weight.mutable_grad() = torch::Tensor();
  const torch::Tensor none = torch::full_like(targets, parallel::kIgnoredTarget);
  const torch::Tensor loss_none = embedding.cross_entropy(embedding.logits(embedding.forward(ids)), none);
  loss_none.backward();
  EXPECT_EQ(loss_none.item<double>(), 0.0) << "loss of a batch with every target ignored";
  EXPECT_EQ(weight.grad().abs().max().item<double>(), 0.0) << "gradient of a batch with every target ignored";
}

}  // namespace kuafu::testing

// AlphaFold's gated attention against PyTorch's own scaled_dot_product_attention (with the biases as its
// additive mask, the gate and projections written out), and in chunks against itself whole, values and
// gradients, in double precision.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "core/nn/gated_attention.h"

namespace kuafu::nn {
namespace {

const auto kF64 = torch::TensorOptions().dtype(torch::kFloat64);
// Double precision: the two computations differ in the order of their sums only (~1e-15 relative).
constexpr double kTolerance = 1e-12;

GatedAttention random_attention(int64_t c_q, int64_t c_kv, int64_t heads, int64_t width, bool gated) {
  GatedAttention attention(GatedAttentionSpec{c_q, c_kv, heads, width, 0, gated}, kF64);
  torch::manual_seed(3);
  torch::NoGradGuard no_grad;
  for (auto& p : attention->parameters()) p.normal_(0, 0.5);  // no zero gate or output: every term counts
  return attention;
}

// The same maths through torch's scaled_dot_product_attention: per head, softmax(q kᵀ/√c + mask) v.
torch::Tensor through_sdpa(GatedAttention& a, const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& bias) {
  const torch::Tensor q = torch::einsum("...qa,ahc->...hqc", {x, a->query_w});
  const torch::Tensor k = torch::einsum("...ka,ahc->...hkc", {y, a->key_w});
  const torch::Tensor v = torch::einsum("...ka,ahc->...hkc", {y, a->value_w});
  torch::Tensor out = at::scaled_dot_product_attention(q, k, v, bias);  // [*, H, Q, c]
  out = out.transpose(-2, -3);                                           // [*, Q, H, c]
  if (a->spec.gated) out = out * torch::sigmoid(torch::einsum("...qa,ahc->...qhc", {x, a->gating_w}) + a->gating_b);
  return torch::einsum("...qhc,hco->...qo", {out, a->output_w}) + a->output_b;
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  EXPECT_LT((actual - expected).abs().max().item<double>(), kTolerance * scale) << what;
}

TEST(GatedAttentionTest, IsScaledDotProductAttentionWithBiasesGateAndProjections) {
  auto g = at::detail::createCPUGenerator(1);
  for (const bool gated : {true, false}) {
    GatedAttention attention = random_attention(6, 5, 3, 4, gated);
    const torch::Tensor x = torch::randn({2, 7, 6}, g, torch::kFloat64);      // [S, Q, c_q]
    const torch::Tensor y = torch::randn({2, 9, 5}, g, torch::kFloat64);      // [S, K, c_kv]
    const torch::Tensor pair = torch::randn({3, 7, 9}, g, torch::kFloat64);   // [H, Q, K]: shared by every row
    const torch::Tensor mask = torch::randn({2, 1, 1, 9}, g, torch::kFloat64) * 10;  // [S, 1, 1, K]
    expect_close(attention->forward(x, y, {pair, mask}), through_sdpa(attention, x, y, pair + mask),
                 gated ? "gated" : "ungated");
  }
}

TEST(GatedAttentionTest, ChunksGiveTheWholeValuesAndGradients) {
  auto g = at::detail::createCPUGenerator(2);
  GatedAttention attention = random_attention(8, 8, 2, 4, true);
  const torch::Tensor x = torch::randn({5, 3, 6, 8}, g, torch::kFloat64).requires_grad_();  // [S, B, R, c]
  const torch::Tensor pair = torch::randn({3, 2, 6, 6}, g, torch::kFloat64).requires_grad_(); // [B, H, R, R]
  const torch::Tensor mask = torch::randn({5, 3, 1, 1, 6}, g, torch::kFloat64);             // [S, B, 1, 1, R]
  const torch::Tensor weights = torch::randn({5, 3, 6, 8}, g, torch::kFloat64);
  auto run = [&](int64_t chunk) {
    attention->zero_grad();
    x.mutable_grad() = torch::Tensor();
    pair.mutable_grad() = torch::Tensor();
    const torch::Tensor out = attention->forward(x, x, {pair, mask}, chunk);
    (out * weights).sum().backward();
    std::vector<torch::Tensor> all = {out.detach(), x.grad().clone(), pair.grad().clone()};
    for (const auto& p : attention->parameters()) all.push_back(p.grad().clone());
    return all;
  };
  const std::vector<torch::Tensor> whole = run(0);
  for (const int64_t chunk : {1, 2, 4}) {
    const std::vector<torch::Tensor> chunked = run(chunk);
    for (size_t i = 0; i < whole.size(); ++i) expect_close(chunked[i], whole[i], "chunk " + std::to_string(chunk) + ", tensor " + std::to_string(i));
  }
}

// A row whose every key is masked (AlphaFold's -1e9 bias) gets the plain mean of the values and no gradient
// into its queries or keys: its logits are clipped to one value, as AlphaFold 2.3 clips them.
TEST(GatedAttentionTest, AFullyMaskedRowTakesTheMeanAndPassesNoGradient) {
  auto g = at::detail::createCPUGenerator(4);
  GatedAttention attention = random_attention(4, 4, 1, 4, false);
  const torch::Tensor x = torch::randn({2, 3, 4}, g, torch::kFloat64).requires_grad_();  // [B, R, c]
  const torch::Tensor mask = torch::tensor({0.0, 0.0, 0.0, 1.0, 1.0, 0.0}, kF64).view({2, 1, 1, 3});  // row 0: all masked
  const torch::Tensor out = attention->forward(x, x, {1e9 * (mask - 1.0)});
  const torch::Tensor values = torch::einsum("...ka,ahc->...khc", {x, attention->value_w}).mean(1);  // [B, H, c]
  const torch::Tensor mean = torch::einsum("bhc,hco->bo", {values, attention->output_w}) + attention->output_b;
  expect_close(out[0], mean[0].unsqueeze(0).expand({3, 4}), "masked row");
  out[0].sum().backward();
  EXPECT_EQ(attention->query_w.grad().abs().max().item<double>(), 0.0);
  EXPECT_EQ(attention->key_w.grad().abs().max().item<double>(), 0.0);
}

TEST(GatedAttentionTest, ABiasIsSlicedOnlyWhereItVariesAlongTheChunkedAxis) {
  const torch::Tensor per_row = torch::zeros({5, 2, 3, 4, 4});  // [S, B, H, Q, K] with 2 leading axes
  EXPECT_EQ(leading_slice(per_row, 2, 1, 2).sizes(), torch::IntArrayRef({2, 2, 3, 4, 4}));
  EXPECT_EQ(leading_slice(torch::zeros({1, 2, 3, 4, 4}), 2, 1, 2).size(0), 1);  // broadcast along S
  EXPECT_EQ(leading_slice(torch::zeros({2, 3, 4, 4}), 2, 1, 2).sizes(), torch::IntArrayRef({2, 3, 4, 4}));  // no S axis
}

TEST(GatedAttentionTest, InitialisationOpensTheGateAndZeroesTheOutput) {
  GatedAttention attention(GatedAttentionSpec{16, 0, 4, 8}, kF64);
  torch::manual_seed(0);
  attention->initialize();
  EXPECT_TRUE(torch::equal(attention->gating_b, torch::ones({4, 8}, kF64)));
  EXPECT_EQ(attention->gating_w.abs().max().item<double>(), 0.0);
  EXPECT_EQ(attention->output_w.abs().max().item<double>(), 0.0);
  // Glorot-uniform: |w| ≤ √(6 / (fan_in + fan_out)) = √(6 / 48), variance limit²/3 = 1/24.
  EXPECT_LE(attention->query_w.abs().max().item<double>(), std::sqrt(6.0 / 48.0));
  EXPECT_NEAR(attention->query_w.var().item<double>(), 1.0 / 24.0, 0.01);
}

}  // namespace
}  // namespace kuafu::nn

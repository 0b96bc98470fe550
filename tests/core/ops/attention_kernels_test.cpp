// runtime.attention_backend: each of LibTorch's attention kernels named alone is the one that runs (or the
// call stops, naming the key, where it cannot take the inputs), gives the result "auto" gives within float32
// rounding, and is what a benchmark's recording notes. Reference for the values: the float64 products.
#include <gtest/gtest.h>

#include "core/ops/attention.h"
#include "core/ops/attention_kernels.h"
#include "tests/support/test_util.h"

namespace kuafu::ops {
namespace {

// The choice is process-wide: every test leaves "auto" behind.
class AttentionKernelsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    choose_attention_backend("auto");
    record_attention_kernels(false);
  }
};

// The kernels one call runs under `backend`, and its output.
std::pair<std::vector<std::string>, torch::Tensor> run_with(const std::string& backend, const torch::Tensor& q,
                                                             const torch::Tensor& k, const torch::Tensor& v, bool causal,
                                                             const AttentionMask& mask = {}) {
  choose_attention_backend(backend);
  record_attention_kernels(true);
  torch::Tensor out = scaled_dot_product_attention(q, k, v, causal, 0.0, mask);
  record_attention_kernels(false);
  return {attention_kernels_seen(), out};
}

using Kernels = std::vector<std::string>;

// Float32, causal, [2, 3, 40, 16]: the CPU's flash kernel under auto and flash, LibTorch's products under math;
// both within 2e-6 of float64 (float32 sums of 40 terms of size 1 round to a few 1e-7).
TEST_F(AttentionKernelsTest, EachNamedKernelRunsAloneAndGivesTheSameAttention) {
  torch::manual_seed(3);
  const torch::Tensor q = torch::randn({2, 3, 40, 16}), k = torch::randn({2, 3, 40, 16}), v = torch::randn({2, 3, 40, 16});
  const torch::Tensor expected = scaled_dot_product_attention(q.to(torch::kFloat64), k.to(torch::kFloat64),
                                                              v.to(torch::kFloat64), /*causal=*/true);
  for (const auto& [backend, kernel] : {std::pair{"auto", "flash"}, std::pair{"flash", "flash"}, std::pair{"math", "math"}}) {
    const auto [seen, out] = run_with(backend, q, k, v, /*causal=*/true);
    EXPECT_EQ(seen, Kernels{kernel}) << backend;
    EXPECT_LT((out.to(torch::kFloat64) - expected).abs().max().item<double>(), 2e-6) << backend;
  }
  // A named kernel on the path "auto" gives Kuafu's products (bf16 below 512 keys) takes it instead.
  const torch::Tensor qb = q.to(torch::kBFloat16), kb = k.to(torch::kBFloat16), vb = v.to(torch::kBFloat16);
  EXPECT_EQ(run_with("auto", qb, kb, vb, true).first, Kernels{"products"});
  EXPECT_EQ(run_with("flash", qb, kb, vb, true).first, Kernels{"flash"});
  // Masks LibTorch's kernels do not take keep Kuafu's products under any choice.
  AttentionMask padding;
  padding.key_padding = torch::ones({2, 40}, torch::kBool);
  padding.key_padding.narrow(1, 0, 3).fill_(false);
  EXPECT_EQ(run_with("flash", q, k, v, false, padding).first, Kernels{"products"});
}

// The CPU has no memory-efficient or cuDNN kernel: naming one stops the first attention with the key, the
// inputs and the way out, instead of LibTorch's "no available kernel".
TEST_F(AttentionKernelsTest, AKernelThatCannotTakeTheInputsStopsNamingTheKey) {
  const torch::Tensor q = torch::randn({1, 2, 8, 16});
  for (const std::string backend : {"efficient", "cudnn"}) {
    choose_attention_backend(backend);
    EXPECT_EQ(libtorch_attention_kernel(q, q, q, {}, 0.0, true), "none") << backend;
    const std::string message = testing::expected_error([&] { scaled_dot_product_attention(q, q, q, true); });
    EXPECT_TRUE(testing::Contains(message, "runtime.attention_backend = \"" + backend + "\"")) << message;
    EXPECT_TRUE(testing::Contains(message, "\"auto\" lets LibTorch choose")) << message;
  }
  EXPECT_TRUE(testing::Contains(testing::expected_error([] { choose_attention_backend("fastest"); }), "\"fastest\""));
}

}  // namespace
}  // namespace kuafu::ops

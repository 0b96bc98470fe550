// The CPU's float32 products through OpenBLAS (core/ops/cpu_blas.h): the process's sgemm_ is Kuafu's,
// LibTorch's products (mm in every layout BLAS reads in place, addmm into a slice, batched and 3-D
// matmul) and the block products of its CPU flash attention reach OpenBLAS and equal the same products
// in float64, and runtime.cpu_blas = "libtorch" sends them back to the MKL in libtorch_cpu.so. Each
// check counts the products OpenBLAS ran, so a path that silently stopped reaching it fails.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/ops/cpu_blas.h"
#include "core/train/runtime.h"

namespace kuafu::ops {
namespace {

// |got - reference| within float32's rounding of a K-term sum of products: 2 K 2⁻²³ (|a| |b|) per entry.
void expect_product(const torch::Tensor& got, const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor a64 = a.to(torch::kFloat64), b64 = b.to(torch::kFloat64);
  const torch::Tensor bound = torch::matmul(a64.abs(), b64.abs()) * (2.0 * static_cast<double>(a.size(-1)) * std::ldexp(1.0, -23));
  const double excess = ((got.to(torch::kFloat64) - torch::matmul(a64, b64)).abs() - bound).max().item<double>();
  EXPECT_LE(excess, 0.0) << a.sizes() << " x " << b.sizes();
}

// Causal attention written out in float64 on the values of q, k, v [B, H, T, D], and its gradients for the
// upstream gradient `upstream`: output, dq, dk, dv.
std::vector<torch::Tensor> causal_attention_float64(const torch::Tensor& q, const torch::Tensor& k,
                                                    const torch::Tensor& v, const torch::Tensor& upstream) {
  const auto as64 = [](const torch::Tensor& t) { return t.detach().to(torch::kFloat64).requires_grad_(true); };
  const torch::Tensor q64 = as64(q), k64 = as64(k), v64 = as64(v);
  const int64_t t = q.size(2);
  const torch::Tensor mask = torch::ones({t, t}, torch::kBool).tril();
  const torch::Tensor scores = torch::matmul(q64, k64.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  const torch::Tensor out64 = torch::matmul(torch::softmax(scores.masked_fill(mask.logical_not(), -INFINITY), -1), v64);
  out64.backward(upstream.to(torch::kFloat64));
  return {out64.detach(), q64.grad(), k64.grad(), v64.grad()};
}

class CpuBlasTest : public ::testing::Test {
 protected:
  void SetUp() override { set_cpu_blas(CpuBlas::kOpenBlas); }
  void TearDown() override { set_cpu_blas(CpuBlas::kOpenBlas); }
};

TEST_F(CpuBlasTest, TheProcesssSgemmIsKuafusAndTheLibTorchChoiceIsLibTorchs) {
  EXPECT_TRUE(sgemm_is_kuafus());
  EXPECT_NE(libtorch_sgemm_library().find("libtorch_cpu"), std::string::npos) << libtorch_sgemm_library();
}

TEST_F(CpuBlasTest, LibTorchsProductsReachOpenBlasAndEqualFloat64s) {
  torch::manual_seed(3);
  for (const auto& [m, k, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{37, 29, 16}, {1, 64, 257}, {130, 70, 3}}) {
    const torch::Tensor a = torch::randn({m, k}), b = torch::randn({k, n});
    // Rows, transposes of row-major matrices, and slices of wider matrices (a leading dimension > width).
    const std::vector<torch::Tensor> as = {a, a.t().contiguous().t(), torch::randn({m, k + 5}).narrow(1, 2, k).copy_(a)};
    const std::vector<torch::Tensor> bs = {b, b.t().contiguous().t(), torch::randn({k + 3, n}).narrow(0, 1, k).copy_(b)};
    for (size_t i = 0; i < as.size(); ++i) {
      for (size_t j = 0; j < bs.size(); ++j) {
        SCOPED_TRACE("layouts " + std::to_string(i) + " x " + std::to_string(j));
        const int64_t before = openblas_sgemm_calls();
        expect_product(torch::mm(as[i], bs[j]), a, b);
        EXPECT_GT(openblas_sgemm_calls(), before);
      }
    }
  }
  // addmm accumulating into a slice of a wider matrix: its neighbours untouched.
  const torch::Tensor a = torch::randn({9, 13}), b = torch::randn({13, 6});
  torch::Tensor wide = torch::randn({9, 10});
  const torch::Tensor before = wide.clone();
  int64_t calls = openblas_sgemm_calls();
  torch::Tensor slice = wide.narrow(1, 2, 6);
  slice.addmm_(a, b);
  EXPECT_GT(openblas_sgemm_calls(), calls);
  expect_product(wide.narrow(1, 2, 6) - before.narrow(1, 2, 6), a, b);
  EXPECT_TRUE(torch::equal(wide.narrow(1, 0, 2), before.narrow(1, 0, 2)));
  EXPECT_TRUE(torch::equal(wide.narrow(1, 8, 2), before.narrow(1, 8, 2)));
  // Batched and 3-D x 2-D products.
  const torch::Tensor x = torch::randn({4, 7, 24}), w = torch::randn({24, 11}), y = torch::randn({4, 24, 5});
  calls = openblas_sgemm_calls();
  expect_product(torch::matmul(x, w), x, w);
  expect_product(torch::bmm(x, y), x, y);
  EXPECT_GT(openblas_sgemm_calls(), calls);
}

// LibTorch's CPU flash attention, causal, forward and backward, against the same attention written out
// in float64; its block products reach OpenBLAS.
TEST_F(CpuBlasTest, FlashAttentionsBlockProductsReachOpenBlas) {
  torch::manual_seed(4);
  const auto make = [] { return torch::randn({1, 2, 300, 16}).requires_grad_(true); };
  const torch::Tensor q = make(), k = make(), v = make();
  const torch::Tensor upstream = torch::randn({1, 2, 300, 16});
  const int64_t before = openblas_sgemm_calls();
  const torch::Tensor out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);  // [1, 2, 300, 16]
  (out * upstream).sum().backward();
  EXPECT_GT(openblas_sgemm_calls(), before);

  const std::vector<torch::Tensor> reference = causal_attention_float64(q, k, v, upstream);
  const std::vector<torch::Tensor> got = {out.detach(), q.grad(), k.grad(), v.grad()};
  // float32 softmax and 300-term sums of unit-scale values: 2e-5 absolute.
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i].to(torch::kFloat64), reference[i], 0, 2e-5)) << "output, dq, dk, dv: " << i;
  }
}

TEST_F(CpuBlasTest, TheLibTorchChoiceAndFloat64ProductsLeaveOpenBlas) {
  torch::manual_seed(5);
  const torch::Tensor a = torch::randn({33, 40}), b = torch::randn({40, 21});
  const int64_t before = openblas_sgemm_calls();
  expect_product(a.to(torch::kFloat64).mm(b.to(torch::kFloat64)), a, b);
  set_cpu_blas(CpuBlas::kLibTorch);
  EXPECT_EQ(cpu_blas(), CpuBlas::kLibTorch);
  expect_product(torch::mm(a, b), a, b);
  EXPECT_EQ(openblas_sgemm_calls(), before);
  set_cpu_blas(CpuBlas::kOpenBlas);
  expect_product(torch::mm(a, b), a, b);
  EXPECT_GT(openblas_sgemm_calls(), before);
}

// LibTorch's CPU flash attention in bfloat16 sends its backward's block products to MKL (bfloat16 in,
// float32 out). With MKL on its instruction-set kernels (Kuafu's default answer; AVX-512's bfloat16 dot
// products on this machine) forward and backward equal the same attention in float64, and once MKL has
// picked its kernels the other choice is refused rather than silently ignored.
TEST(MklKernelsTest, BFloat16FlashAttentionOnMklsInstructionSetKernelsEqualsFloat64) {
  EXPECT_TRUE(mkl_question_is_kuafus());
  torch::manual_seed(6);
  const auto make = [] { return torch::randn({1, 2, 600, 64}).to(torch::kBFloat16).requires_grad_(true); };
  const torch::Tensor q = make(), k = make(), v = make();
  const torch::Tensor upstream = torch::randn({1, 2, 600, 64}).to(torch::kBFloat16);
  const torch::Tensor out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);  // [1, 2, 600, 64]
  out.backward(upstream);
  // MKL has asked by now (the products reached it) and was told to pick by instruction set.
  ASSERT_EQ(mkl_kernels_in_use(), MklKernels::kByInstructionSet);

  const std::vector<torch::Tensor> reference = causal_attention_float64(q, k, v, upstream);
  // The kernel rounds the probabilities and the score gradients to bfloat16 (8 significant bits) before
  // its products, and each result once more: within 4 bfloat16 steps of the largest value (2⁻⁶ of it)
  // everywhere. The errors are 0.18-0.58 of that on either kernels; wrong products are off by whole values.
  const std::vector<torch::Tensor> got = {out.detach(), q.grad(), k.grad(), v.grad()};
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = reference[i].abs().max().item<double>();
    const double error = (got[i].to(torch::kFloat64) - reference[i]).abs().max().item<double>();
    EXPECT_LE(error, std::ldexp(scale, -6)) << "output, dq, dk, dv: " << i << ", largest value " << scale;
  }

  EXPECT_FALSE(set_mkl_kernels(MklKernels::kByVendor));
  EXPECT_EQ(mkl_kernels_in_use(), MklKernels::kByInstructionSet);
  EXPECT_TRUE(set_mkl_kernels(MklKernels::kByInstructionSet));
  // A runtime asking for the other kernels now stops, naming the key.
  config::Schema schema;
  train::add_runtime_schema(schema);
  const config::Config vendor = config::Config::from_string("[runtime]\nmkl_kernels = \"vendor\"\n", "mkl.toml", schema);
  try {
    train::start_runtime(vendor, dist::World::single());
    ADD_FAILURE() << "runtime.mkl_kernels = \"vendor\" was taken after MKL's first call";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("runtime.mkl_kernels"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kuafu::ops

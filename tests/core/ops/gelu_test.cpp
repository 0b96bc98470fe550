// ops::gelu_tanh (GPT-2's tanh GELU) against its formula worked in float64: Kuafu's CPU kernels on both paths
// (AVX2 and the portable loop), through autograd, and LibTorch's where the kernels do not take the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/ops/fused_kernels.h"
#include "core/ops/gelu.h"
#include "core/ops/gelu_tanh_cpu.h"

namespace kuafu::ops {
namespace {

// gelu(x) = x/2 (1 + tanh(√(2/π)(x + 0.044715 x³))) and its derivative, by float64 autograd.
std::pair<torch::Tensor, torch::Tensor> formula(const torch::Tensor& x, const torch::Tensor& dy) {
  const torch::Tensor x64 = x.to(torch::kFloat64).requires_grad_(true);
  const torch::Tensor y = 0.5 * x64 * (1 + torch::tanh(std::sqrt(2.0 / M_PI) * (x64 + 0.044715 * x64.pow(3))));
  y.backward(dy.to(torch::kFloat64));
  return {y.detach(), x64.grad()};
}

// Random values and a sweep through both tails (where exp(-2u) overflows or underflows), float32.
torch::Tensor values() {
  torch::manual_seed(11);
  return torch::cat({torch::randn({4099}) * 3, torch::linspace(-30, 30, 2001)});
}

// Each value's error against float64: at most 1e-6 |x| forward and 1e-6 |dy| (1 + |x|) backward. float32
// rounds each step by 6e-8 relative and exp's argument 2u carries that times |2u|, so the error is a few
// 1e-7 of |x| near 0 and of the (tiny) result in the negative tail; a wrong constant (0.0447 for 0.044715)
// or the erf GELU in its place is off by 1e-5 to 1e-3.
void expect_near_formula(const torch::Tensor& x, const torch::Tensor& dy, const torch::Tensor& y, const torch::Tensor& dx,
                         const std::string& what) {
  const auto [want_y, want_dx] = formula(x, dy);
  const torch::Tensor x64 = x.to(torch::kFloat64), dy64 = dy.to(torch::kFloat64);
  const torch::Tensor y_excess = (y.to(torch::kFloat64) - want_y).abs() - 1e-6 * x64.abs();
  const torch::Tensor dx_excess = (dx.to(torch::kFloat64) - want_dx).abs() - 1e-6 * dy64.abs() * (1 + x64.abs());
  EXPECT_LE(y_excess.max().item<double>(), 0.0) << what << ": y at x = " << x[y_excess.argmax()].item<float>();
  EXPECT_LE(dx_excess.max().item<double>(), 0.0) << what << ": dx at x = " << x[dx_excess.argmax()].item<float>();
}

TEST(GeluTanhTest, BothKernelPathsEqualTheFormulaInFloat64) {
  const torch::Tensor x = values(), dy = torch::randn_like(x);
  for (const CpuPath path : {CpuPath::kBest, CpuPath::kScalar}) {
    torch::Tensor y = torch::empty_like(x), dx = torch::empty_like(x);
    cpu::gelu_tanh(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), path);
    cpu::gelu_tanh_backward(dy.data_ptr<float>(), x.data_ptr<float>(), dx.data_ptr<float>(), x.numel(), path);
    expect_near_formula(x, dy, y, dx, path == CpuPath::kBest ? "best path" : "scalar path");
  }
}

TEST(GeluTanhTest, ThroughAutogradItEqualsTheFormula) {
  const torch::Tensor x0 = values().view({2, -1}), dy = torch::randn_like(x0);
  ASSERT_TRUE(gelu_tanh_kernel_takes(x0));
  const torch::Tensor x = x0.clone().requires_grad_(true);
  const torch::Tensor y = gelu_tanh(x);
  y.backward(dy);
  expect_near_formula(x0.flatten(), dy.flatten(), y.detach().flatten(), x.grad().flatten(), "autograd");
}

// Infinities and NaN come out as from LibTorch's kernel (x = -inf is NaN in both: -inf times 0).
TEST(GeluTanhTest, InfinitiesAndNaNGoThroughAsInLibTorch) {
  const float inf = std::numeric_limits<float>::infinity();
  const torch::Tensor x = torch::tensor({inf, -inf, std::nanf(""), 0.0f, -0.0f});
  const torch::Tensor want = torch::gelu(x, "tanh");
  torch::Tensor y = torch::empty_like(x);
  cpu::gelu_tanh(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), CpuPath::kScalar);
  EXPECT_TRUE(torch::allclose(y, want, 0, 0, /*equal_nan=*/true)) << y << want;
  const torch::Tensor padded = torch::cat({x, torch::zeros({11})});  // eight at a time, then the tail
  torch::Tensor y_best = torch::empty_like(padded);
  cpu::gelu_tanh(padded.data_ptr<float>(), y_best.data_ptr<float>(), padded.numel(), CpuPath::kBest);
  EXPECT_TRUE(torch::allclose(y_best.narrow(0, 0, 5), want, 0, 0, /*equal_nan=*/true)) << y_best << want;
}

// LibTorch's kernel where Kuafu's does not take the tensor (not contiguous, bfloat16) or runtime.fused_gelu
// is false: the same bits as torch::gelu(x, "tanh").
TEST(GeluTanhTest, ElsewhereItIsLibTorchs) {
  const torch::Tensor x = torch::randn({64, 48});
  EXPECT_FALSE(gelu_tanh_kernel_takes(x.t()));
  EXPECT_TRUE(torch::equal(gelu_tanh(x.t()), torch::gelu(x.t(), "tanh")));
  EXPECT_FALSE(gelu_tanh_kernel_takes(x.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(gelu_tanh(x.to(torch::kBFloat16)), torch::gelu(x.to(torch::kBFloat16), "tanh")));
  const FusedKernels before = fused_kernels();
  FusedKernels off = before;
  off.gelu = false;
  set_fused_kernels(off);
  EXPECT_TRUE(torch::equal(gelu_tanh(x), torch::gelu(x, "tanh")));
  set_fused_kernels(before);
  EXPECT_FALSE(torch::equal(gelu_tanh(x), torch::gelu(x, "tanh")));  // on: Kuafu's kernel, other roundings
}

}  // namespace
}  // namespace kuafu::ops

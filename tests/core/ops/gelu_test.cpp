// ops::gelu_tanh (GPT-2's tanh GELU) against its formula worked in float64: Kuafu's CPU kernels on both paths
// (AVX2 and the portable loop), through autograd, in bfloat16 against the float32 kernel and LibTorch's, and
// LibTorch's where the kernels do not take the tensor.
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

uint16_t* bits(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

// Where a and b differ by more than one bfloat16 step (2^-7 of b) plus `slack` (each value's, float64; 1e-38 by
// default, for values near zero): the index, else -1.
int64_t beyond_one_step(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& slack = {}) {
  const torch::Tensor b64 = b.to(torch::kFloat64);
  const torch::Tensor room = b64.abs() * std::ldexp(1.0, -7) + (slack.defined() ? slack : torch::full_like(b64, 1e-38));
  const torch::Tensor excess = (a.to(torch::kFloat64) - b64).abs() - room;
  return excess.max().item<double>() > 0 ? excess.argmax().item<int64_t>() : -1;
}

// bfloat16 through float32 blocks, rounded once: on the scalar path exactly the float32 kernel's values on the
// widened inputs rounded by LibTorch. On the vector path a value may fall in a vector where the float32 run had
// it in a loop's tail (the blocks and threads split elsewhere), whose exponentials differ by an ulp of float32,
// so the rounded results may be one bfloat16 step apart; a wrong block offset would be far off.
TEST(GeluTanhTest, BFloat16IsTheFloat32KernelRoundedOnce) {
  const torch::Tensor x = torch::cat({values(), torch::randn({70001})}).to(torch::kBFloat16);  // more than a task's grain
  const torch::Tensor dy = torch::randn_like(x, torch::kFloat32).to(torch::kBFloat16);
  const torch::Tensor x32 = x.to(torch::kFloat32), dy32 = dy.to(torch::kFloat32);
  for (const CpuPath path : {CpuPath::kScalar, CpuPath::kBest}) {
    const std::string what = path == CpuPath::kBest ? "best path" : "scalar path";
    torch::Tensor want_y = torch::empty_like(x32), want_dx = torch::empty_like(x32);
    cpu::gelu_tanh(x32.data_ptr<float>(), want_y.data_ptr<float>(), x.numel(), path);
    cpu::gelu_tanh_backward(dy32.data_ptr<float>(), x32.data_ptr<float>(), want_dx.data_ptr<float>(), x.numel(), path);
    torch::Tensor y = torch::empty_like(x), dx = torch::empty_like(x);
    cpu::gelu_tanh_bf16(bits(x), bits(y), x.numel(), path);
    cpu::gelu_tanh_backward_bf16(bits(dy), bits(x), bits(dx), x.numel(), path);
    if (path == CpuPath::kScalar) {
      EXPECT_TRUE(torch::equal(y, want_y.to(torch::kBFloat16))) << what;
      EXPECT_TRUE(torch::equal(dx, want_dx.to(torch::kBFloat16))) << what;
    } else {
      EXPECT_EQ(beyond_one_step(y, want_y.to(torch::kBFloat16)), -1) << what << ": y";
      EXPECT_EQ(beyond_one_step(dx, want_dx.to(torch::kBFloat16)), -1) << what << ": dx";
    }
  }
}

// Through autograd against LibTorch's bfloat16 GELU, which also computes in float32 and rounds once: the float32
// values differ within the float32 kernels' bounds against the formula (1e-6 |x| forward, 1e-6 |dy| (1 + |x|)
// backward: tanh's cancellation in the negative tail and near the slope's zero), so the rounded ones by one bfloat16
// step more at most.
TEST(GeluTanhTest, BFloat16ThroughAutogradIsWithinOneStepOfLibTorchs) {
  const torch::Tensor x0 = values().view({2, -1}).to(torch::kBFloat16);
  const torch::Tensor dy = torch::randn_like(x0, torch::kFloat32).to(torch::kBFloat16);
  ASSERT_TRUE(gelu_tanh_kernel_takes(x0));
  const torch::Tensor x = x0.clone().requires_grad_(true), x_libtorch = x0.clone().requires_grad_(true);
  const torch::Tensor y = gelu_tanh(x), y_libtorch = torch::gelu(x_libtorch, "tanh");
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  y.backward(dy);
  y_libtorch.backward(dy);
  const torch::Tensor x64 = x0.to(torch::kFloat64), dy64 = dy.to(torch::kFloat64);
  EXPECT_EQ(beyond_one_step(y.detach(), y_libtorch.detach(), 2e-6 * x64.abs()), -1);
  EXPECT_EQ(beyond_one_step(x.grad(), x_libtorch.grad(), 2e-6 * dy64.abs() * (1 + x64.abs())), -1);
}

// LibTorch's kernel where Kuafu's does not take the tensor (not contiguous, float16) or runtime.fused_gelu
// is false: the same bits as torch::gelu(x, "tanh").
TEST(GeluTanhTest, ElsewhereItIsLibTorchs) {
  const torch::Tensor x = torch::randn({64, 48});
  EXPECT_FALSE(gelu_tanh_kernel_takes(x.t()));
  EXPECT_TRUE(torch::equal(gelu_tanh(x.t()), torch::gelu(x.t(), "tanh")));
  EXPECT_FALSE(gelu_tanh_kernel_takes(x.to(torch::kHalf)));
  EXPECT_TRUE(torch::equal(gelu_tanh(x.to(torch::kHalf)), torch::gelu(x.to(torch::kHalf), "tanh")));
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

// CPU Adam kernel: against torch::optim::AdamW / Adam step for step on every ISA path this CPU has, the
// half-precision copies against Tensor::to, grad scaling, no-bias-correction by hand, threads vs one thread.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "core/optim/cpu_adam.h"
#include "core/util/error.h"

namespace kuafu::optim {
namespace {

// Odd lengths: shorter than one vector, around the 8- and 16-wide vectors and a 64-element thread block,
// and one long enough (> 32K elements) to be split over threads with a ragged end.
const std::vector<int64_t> kLengths = {1, 7, 15, 16, 17, 63, 65, 1000003};

// Forces one path through KUAFU_CPU_ADAM_ISA (read on every call) for one scope.
class ScopedIsa {
 public:
  explicit ScopedIsa(const std::string& isa) { setenv("KUAFU_CPU_ADAM_ISA", isa.c_str(), 1); }
  ~ScopedIsa() { unsetenv("KUAFU_CPU_ADAM_ISA"); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;
};

// The paths this CPU runs: always scalar, then avx2 and avx512 where the CPU has them.
std::vector<std::string> available_isas() {
  unsetenv("KUAFU_CPU_ADAM_ISA");
  const std::string best = cpu_adam_isa();
  std::vector<std::string> isas = {"scalar"};
  if (best == "avx2" || best == "avx512") isas.push_back("avx2");
  if (best == "avx512") isas.push_back("avx512");
  return isas;
}

// Distance in units in the last place between two float tensors (0 = same bits, +0 == -0).
int64_t max_ulp_distance(const torch::Tensor& a, const torch::Tensor& b) {
  auto ordered = [](const torch::Tensor& t) {
    const torch::Tensor bits = t.contiguous().view(torch::kInt32).to(torch::kInt64);
    return torch::where(bits < 0, std::numeric_limits<int32_t>::min() - bits, bits);
  };
  return (ordered(a) - ordered(b)).abs().max().item<int64_t>();
}

struct Buffers {
  torch::Tensor param, exp_avg, exp_avg_sq;  // [n] fp32
  CpuAdamBuffers view(const torch::Tensor& grad) {
    return {param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
            param.numel()};
  }
};

Buffers fresh_buffers(const torch::Tensor& param) {
  return {param.clone(), torch::zeros_like(param), torch::zeros_like(param)};
}

// Tolerance. The kernel does torch's float operations in torch's order, with a fused multiply-add exactly
// where ATen's vectorised kernels have one (add with alpha is an FMA; addcmul is contracted by GCC), so
// against a LibTorch running its AVX2 or AVX-512 kernels exp_avg and exp_avg_sq have the same bits
// (observed 0 ulp on every path, length and step). The param does too, but for the square root: the
// LibTorch 2.x wheel takes float sqrt from MKL's vector library, within 1 ulp of the correctly rounded
// root our kernel uses (measured here: 17% of 2^20 random values off by 1 ulp, none by more). A 1-ulp
// denominator moves an update of at most lr = 1e-2 by ~2^-22 of itself, which can flip the final
// rounding of the param: at most 1 ulp per step, 2^-22 for the randn params below 4 in magnitude; 5 steps
// give kSqrtParamAtol = 5 x 2^-22 = 1.2e-6 (observed 2.4e-7). Only ATen's unvectorised kernels
// (ATEN_CPU_CAPABILITY=default, "NO AVX") round those multiply-adds twice, and Adam amplifies that where a
// gradient nearly cancels (g + wd*p, b1*m + (1-b1)*g): measured there after 5 steps with lr = 1e-2,
// max |dparam| = 1.6e-5, |dexp_avg| = 5.3e-7, |dexp_avg_sq| = 3.8e-10; the loose bounds are 2.5x those.
bool torch_uses_fused_kernels() {
  const std::string config = torch::show_config();
  return config.find("CPU capability usage: AVX2") != std::string::npos ||
         config.find("CPU capability usage: AVX512") != std::string::npos;
}

struct Worst {
  int64_t ulp[3] = {0, 0, 0};      // param, exp_avg, exp_avg_sq: max ulp distance over all steps
  double abs[3] = {0.0, 0.0, 0.0};  // the same as absolute differences
};
constexpr double kUnfusedAtol[3] = {4e-5, 1.3e-6, 1e-9};
constexpr double kSqrtParamAtol = 5 * 2.384185791015625e-7;  // 5 steps x 2^-22
// Adam with L2 feeds the param into the gradient (g + wd p), so the moments inherit its difference:
// |dg| <= wd |dp| = 0.1 kSqrtParamAtol; exp_avg is a weighted mean of gradients (weights sum below 1), so
// |dexp_avg| <= |dg|; exp_avg_sq one of g^2, so |dexp_avg_sq| <= 2 max|g| |dg| with |g| < 1 here
// (0.1 randn + 0.1 param). Observed 1.5e-8 and 1.2e-10.
constexpr double kL2MomentAtol[2] = {0.1 * kSqrtParamAtol, 2 * 0.1 * kSqrtParamAtol};
const char* const kNames[3] = {"param", "exp_avg", "exp_avg_sq"};

template <typename Optimizer, typename Options, typename State>
void step_against_torch(const CpuAdamHyper& hyper, int64_t n, int steps, Worst& worst) {
  torch::manual_seed(n);
  const torch::Tensor param0 = torch::randn({n});
  torch::Tensor reference = param0.clone().requires_grad_(true);
  Optimizer optimizer({reference}, Options(hyper.lr)
                                       .betas({hyper.beta1, hyper.beta2})
                                       .eps(hyper.eps)
                                       .weight_decay(hyper.weight_decay));
  Buffers ours = fresh_buffers(param0);
  for (int step = 1; step <= steps; ++step) {
    const torch::Tensor grad = torch::randn({n}) * 0.1;
    reference.mutable_grad() = grad.clone();
    optimizer.step();
    CpuAdamHyper h = hyper;
    h.step = step;
    cpu_adam_step(h, ours.view(grad));
    auto& state =
        static_cast<State&>(*optimizer.state().at(reference.unsafeGetTensorImpl()));
    const torch::Tensor pairs[3][2] = {{ours.param, reference.detach()},
                                       {ours.exp_avg, state.exp_avg()},
                                       {ours.exp_avg_sq, state.exp_avg_sq()}};
    for (int k = 0; k < 3; ++k) {
      worst.ulp[k] = std::max(worst.ulp[k], max_ulp_distance(pairs[k][0], pairs[k][1]));
      worst.abs[k] = std::max(worst.abs[k], (pairs[k][0] - pairs[k][1]).abs().max().item<double>());
    }
  }
}

void expect_close(const Worst& worst, const std::string& what, bool l2 = false) {
  const bool fused = torch_uses_fused_kernels();
  std::cout << "[ cpu_adam ] " << what << (fused ? "" : " (torch unfused)") << ": max difference vs torch";
  for (int k = 0; k < 3; ++k) std::cout << ", " << kNames[k] << " " << worst.ulp[k] << " ulp (abs " << worst.abs[k] << ")";
  std::cout << "\n";
  for (int k = 0; k < 3; ++k) {
    if (fused && k == 0) {
      EXPECT_LE(worst.abs[k], kSqrtParamAtol) << what << " " << kNames[k];
    } else if (fused && l2) {
      EXPECT_LE(worst.abs[k], kL2MomentAtol[k - 1]) << what << " " << kNames[k];
    } else if (fused) {
      EXPECT_EQ(worst.ulp[k], 0) << what << " " << kNames[k];
    } else {
      EXPECT_LE(worst.abs[k], kUnfusedAtol[k]) << what << " " << kNames[k];
    }
  }
}

TEST(CpuAdam, MatchesTorchAdamWOnEveryPath) {
  CpuAdamHyper hyper;
  hyper.lr = 1e-2;
  hyper.weight_decay = 0.1;
  for (const std::string& isa : available_isas()) {
    ScopedIsa scoped(isa);
    ASSERT_EQ(cpu_adam_isa(), isa);
    Worst worst;
    for (int64_t n : kLengths) {
      step_against_torch<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
          hyper, n, /*steps=*/5, worst);
    }
    expect_close(worst, "AdamW " + isa);
  }
}

TEST(CpuAdam, MatchesTorchAdamWithL2OnEveryPath) {
  CpuAdamHyper hyper;
  hyper.lr = 1e-2;
  hyper.weight_decay = 0.1;
  hyper.decoupled_weight_decay = false;
  for (const std::string& isa : available_isas()) {
    ScopedIsa scoped(isa);
    Worst worst;
    for (int64_t n : kLengths) {
      step_against_torch<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
          hyper, n, /*steps=*/5, worst);
    }
    expect_close(worst, "Adam+L2 " + isa, /*l2=*/true);
  }
}

// The half copy of the updated param must be exactly what Tensor::to gives (round to nearest even).
TEST(CpuAdam, HalfOutputEqualsTensorTo) {
  CpuAdamHyper hyper;
  hyper.weight_decay = 0.01;
  for (const std::string& isa : available_isas()) {
    ScopedIsa scoped(isa);
    for (int64_t n : kLengths) {
      for (auto [kind, dtype] : {std::pair{HalfKind::kBFloat16, torch::kBFloat16}, std::pair{HalfKind::kFloat16, torch::kHalf}}) {
        torch::manual_seed(n);
        Buffers ours = fresh_buffers(torch::randn({n}) * 100);
        const torch::Tensor grad = torch::randn({n});
        torch::Tensor half = torch::empty({n}, dtype);
        CpuAdamBuffers view = ours.view(grad);
        view.half_out = half.data_ptr();
        view.half_kind = kind;
        cpu_adam_step(hyper, view);
        EXPECT_TRUE(torch::equal(half.view(torch::kInt16), ours.param.to(dtype).view(torch::kInt16)))
            << isa << " n=" << n << " " << dtype;
      }
    }
  }
}

// Rounding corner cases, unchanged by a step with lr = 0: ties to even, subnormals, fp16 overflow, infinities.
TEST(CpuAdam, HalfOutputRoundsCornerCasesLikeTensorTo) {
  auto from_bits = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  std::vector<float> values = {
      from_bits(0x3f808000),  // 1 + 2^-8: bf16 tie, rounds down to even 0x3f80
      from_bits(0x3f818000),  // bf16 tie with odd lower bit, rounds up to 0x3f82
      from_bits(0x3f808001),  // just above the tie: rounds up
      1.0f + 1.0f / 2048,     // fp16 tie: rounds to even 1.0
      1.0f + 3.0f / 2048,     // fp16 tie: rounds up
      65504.0f, 65519.0f, 65520.0f, 1e6f,  // fp16 max, last value rounding to it, first to inf, far beyond
      6e-8f, 2.9e-8f, 3e-8f,               // around half the smallest fp16 subnormal (2^-24)
      from_bits(0x00000001), from_bits(0x807fffff), 1e-40f,  // fp32 subnormals
      std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), -0.0f, 0.0f, -3.75f};
  while (values.size() < 40) values.push_back(static_cast<float>(values.size()) * 1.00390625f);  // fill vectors
  const auto n = static_cast<int64_t>(values.size());
  CpuAdamHyper hyper;
  hyper.lr = 0.0;
  for (const std::string& isa : available_isas()) {
    ScopedIsa scoped(isa);
    for (auto [kind, dtype] : {std::pair{HalfKind::kBFloat16, torch::kBFloat16}, std::pair{HalfKind::kFloat16, torch::kHalf}}) {
      Buffers ours = fresh_buffers(torch::tensor(values));
      const torch::Tensor grad = torch::ones({n});
      torch::Tensor half = torch::empty({n}, dtype);
      CpuAdamBuffers view = ours.view(grad);
      view.half_out = half.data_ptr();
      view.half_kind = kind;
      cpu_adam_step(hyper, view);
      EXPECT_TRUE(torch::equal(ours.param, torch::tensor(values))) << isa;  // lr = 0 leaves the values alone
      EXPECT_TRUE(torch::equal(half.view(torch::kInt16), ours.param.to(dtype).view(torch::kInt16))) << isa << " " << dtype;
      if (kind == HalfKind::kBFloat16) {
        EXPECT_EQ(static_cast<uint16_t>(half[0].view(torch::kInt16).item<int16_t>()), 0x3f80) << isa;
        EXPECT_EQ(static_cast<uint16_t>(half[1].view(torch::kInt16).item<int16_t>()), 0x3f82) << isa;
      }
    }
  }
}

TEST(CpuAdam, NanParamGivesNanHalf) {
  for (const std::string& isa : available_isas()) {
    ScopedIsa scoped(isa);
    for (auto [kind, dtype] : {std::pair{HalfKind::kBFloat16, torch::kBFloat16}, std::pair{HalfKind::kFloat16, torch::kHalf}}) {
      Buffers ours = fresh_buffers(torch::full({19}, std::numeric_limits<float>::quiet_NaN()));
      const torch::Tensor grad = torch::ones({19});
      torch::Tensor half = torch::zeros({19}, dtype);
      CpuAdamBuffers view = ours.view(grad);
      view.half_out = half.data_ptr();
      view.half_kind = kind;
      cpu_adam_step(CpuAdamHyper{}, view);
      EXPECT_TRUE(half.to(torch::kFloat32).isnan().all().item<bool>()) << isa << " " << dtype;
    }
  }
}

// Multiplying by 0.5 is exact, so the scale folded into the pass must give the same bits as scaled grads.
TEST(CpuAdam, GradScaleEqualsScaledGrads) {
  CpuAdamHyper hyper;
  hyper.weight_decay = 0.01;
  for (bool decoupled : {true, false}) {
    hyper.decoupled_weight_decay = decoupled;
    for (const std::string& isa : available_isas()) {
      ScopedIsa scoped(isa);
      torch::manual_seed(3);
      const torch::Tensor param0 = torch::randn({1003});
      Buffers scaled = fresh_buffers(param0), prescaled = fresh_buffers(param0);
      for (int step = 1; step <= 3; ++step) {
        hyper.step = step;
        const torch::Tensor grad = torch::randn({1003});
        const torch::Tensor half_grad = grad * 0.5;
        CpuAdamBuffers view = scaled.view(grad);
        view.grad_scale = 0.5f;
        cpu_adam_step(hyper, view);
        cpu_adam_step(hyper, prescaled.view(half_grad));
      }
      EXPECT_TRUE(torch::equal(scaled.param, prescaled.param)) << isa;
      EXPECT_TRUE(torch::equal(scaled.exp_avg, prescaled.exp_avg)) << isa;
      EXPECT_TRUE(torch::equal(scaled.exp_avg_sq, prescaled.exp_avg_sq)) << isa;
    }
  }
}

// Without bias correction the step is p <- p (1 - lr wd) - lr m / (sqrt(v) + eps), whatever the step number.
// lr = 0.5, wd = 0.5 (decay factor 0.75), b1 = 0.5, b2 = 0.75, eps = 0.25:
//   p=2,  g=1,  m=1,  v=1:  p'=1.5,  m=0.5+0.5=1,   v=0.75+0.25=1,  denom=1.25,  p=1.5-0.5*1/1.25   = 1.1
//   p=-4, g=-2, m=0,  v=4:  p'=-3,   m=0-1=-1,      v=3+1=4,        denom=2.25,  p=-3+0.5/2.25      = -2.7777...
//   p=1,  g=0,  m=2,  v=12: p'=0.75, m=1+0=1,       v=9+0=9,        denom=3.25,  p=0.75-0.5/3.25    = 0.5961538...
//   p=0,  g=4,  m=-2, v=0:  p'=0,    m=-1+2=1,      v=0+4=4,        denom=2.25,  p=0-0.5/2.25       = -0.2222...
// The four are tiled 17 times (68 elements) so that the vector loops and the tail both see them.
TEST(CpuAdam, NoBiasCorrectionMatchesHandWorkedStep) {
  const std::vector<float> p0 = {2, -4, 1, 0}, g0 = {1, -2, 0, 4}, m0 = {1, 0, 2, -2}, v0 = {1, 4, 12, 0};
  const std::vector<float> p1 = {1.1f, -3.0f + 0.5f / 2.25f, 0.75f - 0.5f / 3.25f, -0.5f / 2.25f};
  const std::vector<float> m1 = {1, -1, 1, 1}, v1 = {1, 4, 9, 4};
  CpuAdamHyper hyper;
  hyper.lr = 0.5;
  hyper.weight_decay = 0.5;
  hyper.beta1 = 0.5;
  hyper.beta2 = 0.75;
  hyper.eps = 0.25;
  hyper.bias_correction = false;
  hyper.step = 7;  // ignored without bias correction
  for (const std::string& isa : available_isas()) {
    ScopedIsa scoped(isa);
    const auto tile = [](const std::vector<float>& v) { return torch::tensor(v).repeat({17}); };
    Buffers ours{tile(p0), tile(m0), tile(v0)};
    const torch::Tensor grad = tile(g0);
    cpu_adam_step(hyper, ours.view(grad));
    EXPECT_TRUE(torch::allclose(ours.param, tile(p1), /*rtol=*/1e-6, /*atol=*/1e-7)) << isa << ours.param.slice(0, 0, 4);
    EXPECT_TRUE(torch::equal(ours.exp_avg, tile(m1))) << isa;  // exact in binary
    EXPECT_TRUE(torch::equal(ours.exp_avg_sq, tile(v1))) << isa;
  }
}

TEST(CpuAdam, ThreadsGiveTheSameBitsAsOneThread) {
  const int threads_before = at::get_num_threads();
  const int64_t n = 1000003;
  torch::manual_seed(5);
  const torch::Tensor param0 = torch::randn({n}), grad = torch::randn({n});
  std::vector<Buffers> results;
  std::vector<torch::Tensor> halves;
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    Buffers ours = fresh_buffers(param0);
    torch::Tensor half = torch::empty({n}, torch::kBFloat16);
    CpuAdamBuffers view = ours.view(grad);
    view.half_out = half.data_ptr();
    view.half_kind = HalfKind::kBFloat16;
    cpu_adam_step(CpuAdamHyper{}, view);
    results.push_back(ours);
    halves.push_back(half);
  }
  at::set_num_threads(threads_before);
  EXPECT_TRUE(torch::equal(results[0].param, results[1].param));
  EXPECT_TRUE(torch::equal(results[0].exp_avg, results[1].exp_avg));
  EXPECT_TRUE(torch::equal(results[0].exp_avg_sq, results[1].exp_avg_sq));
  EXPECT_TRUE(torch::equal(halves[0].view(torch::kInt16), halves[1].view(torch::kInt16)));
}

TEST(CpuAdam, RejectsBadInput) {
  float x = 0;
  CpuAdamBuffers missing_half{&x, &x, &x, &x, 1};
  missing_half.half_kind = HalfKind::kBFloat16;
  EXPECT_THROW(cpu_adam_step(CpuAdamHyper{}, missing_half), kuafu::Error);
  CpuAdamHyper step0;
  step0.step = 0;
  EXPECT_THROW(cpu_adam_step(step0, CpuAdamBuffers{&x, &x, &x, &x, 1}), kuafu::Error);
  ScopedIsa scoped("avx");
  EXPECT_THROW(cpu_adam_isa(), kuafu::Error);
}

}  // namespace
}  // namespace kuafu::optim

// Optimizers against independent references: torch::optim (AdamW, Adam, SGD) step for step, and
// LAMB / LARS steps worked by hand from the papers' formulas on two-element tensors (values in the
// comments). Plus parameter groups, exact state save/load and gradient clipping.
#include <gtest/gtest.h>

#include "core/optim/algorithms.h"
#include "core/optim/grad_norm.h"
#include "core/optim/optim_config.h"
#include "tests/support/devices.h"
#include "tests/support/test_util.h"

namespace kuafu {
namespace {

using optim::Param;
using optim::ParamGroup;

// A named float64 leaf with a fixed gradient.
Param leaf(const std::string& name, std::vector<double> values, std::vector<double> grad) {
  torch::Tensor t = torch::tensor(values, torch::kFloat64).requires_grad_(true);
  t.mutable_grad() = torch::tensor(grad, torch::kFloat64);
  return {name, t, nullptr, true};
}

ParamGroup group_of(std::vector<Param> params, double weight_decay, bool trust_scaling = true) {
  ParamGroup group{"g", std::move(params), {}};
  group.options.weight_decay = weight_decay;
  group.options.trust_scaling = trust_scaling;
  return group;
}

void expect_values(const torch::Tensor& t, std::vector<double> expected, double tolerance = 1e-12) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(t[static_cast<int64_t>(i)].item<double>(), expected[i], tolerance) << "element " << i;
  }
}

// --- torch::optim as the reference -----------------------------------------------------------------

struct TwoParams {
  torch::Tensor matrix, bias;  // the first gets weight decay, the second none
};

TwoParams random_params(int64_t seed, torch::Dtype dtype, const torch::Device& device = torch::kCPU) {
  torch::manual_seed(seed);
  return {torch::randn({37, 29}, dtype).to(device).requires_grad_(true), torch::randn({29}, dtype).to(device).requires_grad_(true)};
}

void set_random_grads(const std::vector<torch::Tensor>& params, int64_t step) {
  torch::manual_seed(1000 + step);
  for (const auto& p : params) p.mutable_grad() = torch::randn(p.sizes(), p.scalar_type()).to(p.device());
}

// Runs `steps` steps of ours and of torch's on copies of the same parameters and gradients, with a
// changing learning rate; returns the largest difference in the parameters.
double max_difference_to_torch(optim::Optimizer& ours, TwoParams& mine, torch::optim::Optimizer& theirs,
                               TwoParams& reference, int steps) {
  double worst = 0;
  for (int step = 0; step < steps; ++step) {
    const double lr = 1e-2 / (step + 1);
    ours.set_lr(lr);
    for (auto& group : theirs.param_groups()) group.options().set_lr(lr);
    set_random_grads({mine.matrix, mine.bias}, step);
    set_random_grads({reference.matrix, reference.bias}, step);
    ours.step();
    theirs.step();
    worst = std::max({worst, (mine.matrix - reference.matrix).abs().max().item<double>(),
                      (mine.bias - reference.bias).abs().max().item<double>()});
  }
  return worst;
}

std::vector<ParamGroup> decay_and_bias(const TwoParams& p, double weight_decay) {
  ParamGroup decay{"decay", {{"matrix", p.matrix, nullptr, true}}, {}};
  decay.options.weight_decay = weight_decay;
  ParamGroup no_decay{"no_decay", {{"bias", p.bias, nullptr, true}}, {}};
  return {decay, no_decay};
}

std::vector<torch::optim::OptimizerParamGroup> torch_groups(
    const TwoParams& p, std::unique_ptr<torch::optim::OptimizerOptions> decay,
    std::unique_ptr<torch::optim::OptimizerOptions> no_decay) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p.matrix}, std::move(decay));
  groups.emplace_back(std::vector<torch::Tensor>{p.bias}, std::move(no_decay));
  return groups;
}

// On every device (tests/support/devices.h): the CPU's fused kernel is the vectorised CPU Adam, a
// GPU's is ATen's fused multi-tensor AdamW.
TEST(OptimizerTest, AdamWFollowsTorchAdamWStepForStep) {
  for (const torch::Device& device : testing::devices_to_test()) {
    for (const bool fused : {false, true}) {
      SCOPED_TRACE(device.str() + (fused ? " fused" : ""));
      auto mine = random_params(1, torch::kFloat32, device), reference = random_params(1, torch::kFloat32, device);
      optim::AdamOptions options;
      options.beta2 = 0.95;
      options.fused_cpu = options.fused_cuda = fused;
      optim::AdamW ours(decay_and_bias(mine, 0.1), options);
      auto adamw = [](double wd) {
        auto o = std::make_unique<torch::optim::AdamWOptions>(1e-2);
        o->betas({0.9, 0.95}).eps(1e-8).weight_decay(wd);
        return o;
      };
      torch::optim::AdamW theirs(torch_groups(reference, adamw(0.1), adamw(0.0)), torch::optim::AdamWOptions(1e-2));
      // The tensor path runs torch's own sequence of operations: bitwise equal. The fused kernels
      // reproduce ATen's vectorised kernels (cpu_adam_test checks that per ISA); a few float32 ulps of
      // the ~1 weights are allowed for kernels that round differently (fused multiply-adds).
      const double difference = max_difference_to_torch(ours, mine, theirs, reference, 6);
      if (fused) {
        EXPECT_LE(difference, 1e-6);
      } else {
        EXPECT_EQ(difference, 0.0);
      }
    }
  }
}

TEST(OptimizerTest, AdamWithL2FollowsTorchAdam) {
  for (const torch::Device& device : testing::devices_to_test()) {
    for (const bool fused : {false, true}) {
      SCOPED_TRACE(device.str() + (fused ? " fused" : ""));
      auto mine = random_params(2, torch::kFloat32, device), reference = random_params(2, torch::kFloat32, device);
      optim::AdamOptions options;
      options.decoupled_weight_decay = false;
      options.fused_cpu = options.fused_cuda = fused;
      optim::AdamW ours(decay_and_bias(mine, 0.05), options);
      auto adam = [](double wd) {
        auto o = std::make_unique<torch::optim::AdamOptions>(1e-2);
        o->weight_decay(wd);
        return o;
      };
      torch::optim::Adam theirs(torch_groups(reference, adam(0.05), adam(0.0)), torch::optim::AdamOptions(1e-2));
      EXPECT_EQ(ours.name(), "adam");
      const double difference = max_difference_to_torch(ours, mine, theirs, reference, 6);
      if (fused) {
        EXPECT_LE(difference, 1e-6);
      } else {
        EXPECT_EQ(difference, 0.0);
      }
    }
  }
}

TEST(OptimizerTest, SgdFollowsTorchSgdWithMomentumAndNesterov) {
  for (const bool nesterov : {false, true}) {
    auto mine = random_params(3, torch::kFloat64), reference = random_params(3, torch::kFloat64);
    optim::Sgd ours(decay_and_bias(mine, 1e-3), optim::SgdOptions{0.9, 0.0, nesterov});
    auto sgd = [&](double wd) {
      auto o = std::make_unique<torch::optim::SGDOptions>(1e-2);
      o->momentum(0.9).nesterov(nesterov).weight_decay(wd);
      return o;
    };
    torch::optim::SGD theirs(torch_groups(reference, sgd(1e-3), sgd(0.0)), torch::optim::SGDOptions(1e-2));
    // float64 on both sides and the same operations: equal to rounding.
    EXPECT_LE(max_difference_to_torch(ours, mine, theirs, reference, 5), 1e-14) << "nesterov " << nesterov;
  }
}

// --- LAMB worked by hand ---------------------------------------------------------------------------
// p = [3, 4] (||p|| = 5), g = [0.6, 0.8], beta1 0.9, beta2 0.999, eps 0, weight decay 0.1, lr 0.01.
// Step 1 with bias correction: m^ = g and v^ = g^2, so m^ / sqrt(v^) = [1, 1] and
// u = [1, 1] + 0.1 p = [1.3, 1.4]; ||u|| = sqrt(3.65) = 1.910497317; r = 5 / ||u|| = 2.617119613;
// p - 0.01 r u = [2.965977445, 3.963360325].

optim::LambOptions lamb_options(double clamp = 0.0, bool bias_correction = true) {
  optim::LambOptions o;
  o.eps = 0.0;
  o.trust_clamp = clamp;
  o.bias_correction = bias_correction;
  return o;
}

TEST(LambTest, FirstStepMatchesTheHandWorkedStep) {
  Param p = leaf("w", {3, 4}, {0.6, 0.8});
  optim::Lamb lamb({group_of({p}, 0.1)}, lamb_options());
  lamb.set_lr(0.01);
  lamb.step();
  expect_values(p.tensor, {2.965977445031636, 3.963360325418685});
  // Step 2, same gradient: m^ = g, v^ = g^2 again, u = 1 + 0.1 p1, r = ||p1|| / ||u||.
  lamb.step();
  expect_values(p.tensor, {2.9322932273979023, 3.927085014120818});
}

TEST(LambTest, WithoutBiasCorrection) {
  // m = 0.1 g, sqrt(v) = sqrt(0.001) |g|, so m / sqrt(v) = 0.1 / 0.0316228 = 3.16228 per element;
  // u = [3.46228, 3.56228], r = 5 / ||u|| = 1.00651943; p - 0.01 r u = [2.9651515, 3.9641450].
  Param p = leaf("w", {3, 4}, {0.6, 0.8});
  optim::Lamb lamb({group_of({p}, 0.1)}, lamb_options(0.0, /*bias_correction=*/false));
  lamb.set_lr(0.01);
  lamb.step();
  expect_values(p.tensor, {2.965151502620764, 3.9641449831905016});
}

TEST(LambTest, ZeroNormsGiveTrustRatioOne) {
  // ||p|| = 0: r = 1, so p = 0 - 0.01 [1, 1] (the decay term 0.1 p is 0).
  Param zero_weight = leaf("a", {0, 0}, {0.6, 0.8});
  optim::Lamb lamb({group_of({zero_weight}, 0.1)}, lamb_options());
  lamb.set_lr(0.01);
  lamb.step();
  expect_values(zero_weight.tensor, {-0.01, -0.01});
  // g = 0 and no decay: u = 0 / (0 + eps) = 0, so ||u|| = 0, r = 1 (not 5 / 0) and nothing moves.
  Param zero_update = leaf("b", {3, 4}, {0, 0});
  optim::LambOptions with_eps = lamb_options();
  with_eps.eps = 1e-6;
  optim::Lamb still({group_of({zero_update}, 0.0)}, with_eps);
  still.set_lr(0.01);
  still.step();
  expect_values(zero_update.tensor, {3, 4});
}

TEST(LambTest, TrustClampAndExcludedGroups) {
  // Clamp 1 caps r = 2.617 at 1: p - 0.01 [1.3, 1.4] = [2.987, 3.986].
  Param clamped = leaf("w", {3, 4}, {0.6, 0.8});
  optim::Lamb lamb({group_of({clamped}, 0.1)}, lamb_options(/*clamp=*/1.0));
  lamb.set_lr(0.01);
  lamb.step();
  expect_values(clamped.tensor, {2.987, 3.986});
  // A group without trust scaling and without decay takes the plain Adam step: p - 0.01 [1, 1].
  Param excluded = leaf("bias", {3, 4}, {0.6, 0.8});
  optim::Lamb plain({group_of({excluded}, 0.0, /*trust_scaling=*/false)}, lamb_options());
  plain.set_lr(0.01);
  plain.step();
  expect_values(excluded.tensor, {2.99, 3.99});
}

TEST(LambTest, GlobalNormPreClippingScalesTheGradients) {
  // Pre-clipping to 0.5 halves g (||g|| = 1); Adam's m^ / sqrt(v^) does not depend on the scale of g
  // (eps 0), so the step equals the unclipped one, while the moments are halved / quartered.
  Param p = leaf("w", {3, 4}, {0.6, 0.8});
  optim::LambOptions options = lamb_options();
  options.max_grad_norm = 0.5;
  optim::Lamb lamb({group_of({p}, 0.1)}, options);
  lamb.set_lr(0.01);
  lamb.step();
  expect_values(p.tensor, {2.965977445031636, 3.963360325418685});
  const auto state = lamb.state_tensors();
  expect_values(state[1].second, {0.1 * 0.3, 0.1 * 0.4});  // exp_avg = (1 - beta1) g / 2
}

// --- LARS worked by hand ---------------------------------------------------------------------------
// p = [3, 4], g = [0.6, 0.8] (||g|| = 1), weight decay 0.1, eeta 0.001, eps 0, lr 1, momentum 0.9.
// Step 1: r = 0.001 * 5 / (1 + 0.1 * 5) = 1/300; d = r (g + 0.1 p) = [0.9, 1.2] / 300 = [0.003, 0.004];
// b = d; p = [2.997, 3.996].
// Step 2 (same g): r = 0.001 * 4.995 / (1 + 0.4995) = 0.00333111; d = r [0.8997, 1.1996] = [0.002997, 0.003996];
// b = 0.9 [0.003, 0.004] + d = [0.005697, 0.007596]; p = [2.991303, 3.988404].

optim::LarsOptions lars_options(double eeta = 1e-3, double clamp = 0.0) {
  optim::LarsOptions o;
  o.momentum = 0.9;
  o.trust_coefficient = eeta;
  o.eps = 0.0;
  o.trust_clamp = clamp;
  return o;
}

TEST(LarsTest, TwoStepsMatchTheHandWorkedSteps) {
  Param p = leaf("w", {3, 4}, {0.6, 0.8});
  optim::Lars lars({group_of({p}, 0.1)}, lars_options());
  lars.set_lr(1.0);
  lars.step();
  expect_values(p.tensor, {2.997, 3.996});
  lars.step();
  expect_values(p.tensor, {2.991303, 3.988404});
}

TEST(LarsTest, ZeroNormClampAndExclusion) {
  // ||p|| = 0: r = 1, d = 0.1 g = [0.06, 0.08].
  Param zero = leaf("a", {0, 0}, {0.6, 0.8});
  optim::Lars lars({group_of({zero}, 0.1)}, lars_options());
  lars.set_lr(0.1);
  lars.step();
  expect_values(zero.tensor, {-0.06, -0.08});
  // eeta 1: r = 5 / 1.5 = 3.33, clamped to 2: d = 2 [0.9, 1.2] = [1.8, 2.4].
  Param clamped = leaf("w", {3, 4}, {0.6, 0.8});
  optim::Lars capped({group_of({clamped}, 0.1)}, lars_options(/*eeta=*/1.0, /*clamp=*/2.0));
  capped.set_lr(1.0);
  capped.step();
  expect_values(clamped.tensor, {1.2, 1.6});
  // Excluded: r = 1 and no decay: p - 0.1 g.
  Param excluded = leaf("bias", {3, 4}, {0.6, 0.8});
  optim::Lars plain({group_of({excluded}, 0.0, /*trust_scaling=*/false)}, lars_options());
  plain.set_lr(0.1);
  plain.step();
  expect_values(excluded.tensor, {2.94, 3.92});
}

// --- groups, state, clipping -----------------------------------------------------------------------

TEST(ParamGroupsTest, NamePatternsExcludeBiasesAndNormsFromDecayAndTrustScaling) {
  std::vector<Param> params;
  for (const std::string name : {"transformer.wte.weight", "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
                                 "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                                 "transformer.ln_f.weight", "encoder.layernorm.weight"}) {
    params.push_back({name, torch::zeros({2}), nullptr, true});
  }
  const auto groups = optim::make_param_groups(params, {"*.bias", "*ln_*", "*norm*"}, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  std::vector<std::string> decay, no_decay;
  for (const auto& p : groups[0].params) decay.push_back(p.name);
  for (const auto& p : groups[1].params) no_decay.push_back(p.name);
  EXPECT_EQ(decay, (std::vector<std::string>{"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight"}));
  EXPECT_EQ(no_decay.size(), 5u);
  EXPECT_DOUBLE_EQ(groups[0].options.weight_decay, 0.1);
  EXPECT_TRUE(groups[0].options.trust_scaling);
  EXPECT_DOUBLE_EQ(groups[1].options.weight_decay, 0.0);
  EXPECT_FALSE(groups[1].options.trust_scaling);
}

std::unique_ptr<optim::Optimizer> make(const std::string& name, std::vector<ParamGroup> groups) {
  if (name == "adamw") return std::make_unique<optim::AdamW>(std::move(groups), optim::AdamOptions{});
  if (name == "sgd") return std::make_unique<optim::Sgd>(std::move(groups), optim::SgdOptions{0.9, 0.0, true});
  if (name == "lamb") return std::make_unique<optim::Lamb>(std::move(groups), optim::LambOptions{});
  return std::make_unique<optim::Lars>(std::move(groups), optim::LarsOptions{});
}

TEST(OptimizerStateTest, SaveAndLoadResumesBitwise) {
  const auto dir = testing::temp_dir("optim_state");
  for (const std::string name : {"adamw", "sgd", "lamb", "lars"}) {
    auto a = random_params(5, torch::kFloat32), b = random_params(5, torch::kFloat32);
    auto first = make(name, decay_and_bias(a, 0.01));
    first->set_lr(1e-2);
    for (int step = 0; step < 3; ++step) {
      set_random_grads({a.matrix, a.bias}, step);
      first->step();
    }
    const std::string path = (dir / (name + ".safetensors")).string();
    io::save_safetensors(path, first->state_tensors(), {{"optimizer", first->name()}});
    // A fresh optimizer over copies of the weights continues exactly where the first one stands.
    {
      torch::NoGradGuard no_grad;
      b.matrix.copy_(a.matrix);
      b.bias.copy_(a.bias);
    }
    auto second = make(name, decay_and_bias(b, 0.01));
    second->set_lr(1e-2);
    second->load_state_tensors(io::load_safetensors(path), path);
    EXPECT_EQ(second->steps_taken(), 3);
    for (int step = 3; step < 5; ++step) {
      set_random_grads({a.matrix, a.bias}, step);
      set_random_grads({b.matrix, b.bias}, step);
      first->step();
      second->step();
    }
    EXPECT_TRUE(torch::equal(a.matrix, b.matrix)) << name;
    EXPECT_TRUE(torch::equal(a.bias, b.bias)) << name;
  }
}

// A step in parts (Gemini's disk tier steps a chunk at a time), with the state in memory the caller placed
// (set_state), gives the bits of one step: each group split across the parts, the parts in either order.
TEST(OptimizerStateTest, AStepInPartsWithPlacedStateEqualsOneStep) {
  for (const std::string name : {"adamw", "sgd", "lamb", "lars"}) {
    for (const bool matrix_first : {true, false}) {
      auto a = random_params(9, torch::kFloat32), b = random_params(9, torch::kFloat32);
      auto whole = make(name, decay_and_bias(a, 0.01));
      auto parts = make(name, decay_and_bias(b, 0.01));
      // The matrix's state in a record of the caller's (zeros, as an optimizer's state starts).
      const int64_t n = b.matrix.numel();
      const torch::Tensor record = torch::zeros({whole->state_slots() * n});
      std::vector<torch::Tensor> slots;
      for (int s = 0; s < whole->state_slots(); ++s) slots.push_back(record.narrow(0, s * n, n).view(b.matrix.sizes()));
      parts->set_state("matrix", slots);
      for (int step = 0; step < 3; ++step) {
        whole->set_lr(1e-2 / (step + 1));
        parts->set_lr(1e-2 / (step + 1));
        set_random_grads({a.matrix, a.bias}, step);
        set_random_grads({b.matrix, b.bias}, step);
        whole->step();
        parts->begin_step();
        const std::string first = matrix_first ? "matrix" : "bias", second = matrix_first ? "bias" : "matrix";
        parts->update([&](const std::string& p) { return p == first; });
        parts->update([&](const std::string& p) { return p == second; });
      }
      EXPECT_TRUE(torch::equal(a.matrix, b.matrix)) << name;
      EXPECT_TRUE(torch::equal(a.bias, b.bias)) << name;
      // The placed state is the state the optimizer keeps, updated where the caller put it.
      if (whole->state_slots() > 0) {
        for (const auto& [state_name, tensor] : whole->state_tensors()) {
          if (state_name == "matrix/" + std::string(name == "lars" || name == "sgd" ? "momentum_buffer" : "exp_avg")) {
            EXPECT_TRUE(torch::equal(tensor.reshape(-1), record.narrow(0, 0, n))) << name;
          }
        }
      }
    }
  }
  auto a = random_params(9, torch::kFloat32);
  auto adamw = make("adamw", decay_and_bias(a, 0.01));
  EXPECT_NE(testing::error_message([&] { adamw->set_state("matrix", {torch::zeros({3})}); }).find("'matrix'"),
            std::string::npos);
  EXPECT_NE(testing::error_message([&] { adamw->set_state("nothing", {}); }).find("'nothing'"), std::string::npos);
}

// A step given the clipping factor (AdamW's kernels scale each gradient as they read it; the others have
// the gradients multiplied first) gives the bits of multiplying the gradients, then stepping: every
// optimizer, and AdamW's CPU kernel and its LibTorch formula.
TEST(OptimizerStateTest, AStepWithAGradientFactorEqualsScalingTheGradientsFirst) {
  const double factor = 0.3712;  // a clipping coefficient: not a power of two, so the rounding shows
  for (const std::string name : {"adamw", "adamw formula", "sgd", "lamb", "lars"}) {
    auto a = random_params(11, torch::kFloat32), b = random_params(11, torch::kFloat32);
    auto optimizer_of = [&](const TwoParams& p) -> std::unique_ptr<optim::Optimizer> {
      if (name != "adamw formula") return make(name, decay_and_bias(p, 0.01));
      optim::AdamOptions options;
      options.fused_cpu = false;
      return std::make_unique<optim::AdamW>(decay_and_bias(p, 0.01), options);
    };
    auto given = optimizer_of(a), scaled_first = optimizer_of(b);
    for (int step = 0; step < 3; ++step) {
      given->set_lr(1e-2);
      scaled_first->set_lr(1e-2);
      set_random_grads({a.matrix, a.bias}, step);
      set_random_grads({b.matrix, b.bias}, step);
      given->step(factor);
      optim::scale_grads({{"matrix", b.matrix, nullptr, true}, {"bias", b.bias, nullptr, true}}, factor);
      scaled_first->step();
    }
    EXPECT_TRUE(torch::equal(a.matrix, b.matrix)) << name;
    EXPECT_TRUE(torch::equal(a.bias, b.bias)) << name;
    // Without the factor the steps differ: the test sees it.
    auto c = random_params(11, torch::kFloat32);
    auto unscaled = optimizer_of(c);
    unscaled->set_lr(1e-2);
    set_random_grads({c.matrix, c.bias}, 0);
    unscaled->step();
    auto d = random_params(11, torch::kFloat32);
    auto once = optimizer_of(d);
    once->set_lr(1e-2);
    set_random_grads({d.matrix, d.bias}, 0);
    once->step(factor);
    EXPECT_FALSE(torch::equal(c.matrix, d.matrix)) << name;
  }
}

TEST(OptimizerStateTest, MismatchedStateIsRefusedWithTheReason) {
  const auto dir = testing::temp_dir("optim_state_bad");
  auto a = random_params(6, torch::kFloat32);
  auto adamw = make("adamw", decay_and_bias(a, 0.01));
  set_random_grads({a.matrix, a.bias}, 0);
  adamw->step();
  const std::string path = (dir / "adamw.safetensors").string();
  io::save_safetensors(path, adamw->state_tensors(), {{"optimizer", "adamw"}});
  auto lamb = make("lamb", decay_and_bias(a, 0.01));
  EXPECT_NE(testing::error_message([&] { lamb->load_state_tensors(io::load_safetensors(path), path); })
                .find("cannot resume lamb"),
            std::string::npos);
  TwoParams other{torch::zeros({5, 5}, torch::requires_grad()), a.bias};
  auto wrong_shape = make("adamw", decay_and_bias(other, 0.01));
  const std::string message =
      testing::error_message([&] { wrong_shape->load_state_tensors(io::load_safetensors(path), path); });
  EXPECT_NE(message.find("matrix/exp_avg"), std::string::npos) << message;
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

TEST(OptimizerStateTest, StateOfAnotherDtypeOrWithNonFiniteValuesIsRefused) {
  const auto dir = testing::temp_dir("optim_state_values");
  auto a = random_params(8, torch::kFloat32);
  auto adamw = make("adamw", decay_and_bias(a, 0.01));
  set_random_grads({a.matrix, a.bias}, 0);
  adamw->step();
  // One state tensor replaced: integer bits (cast silently before), then NaNs (loaded silently before).
  const auto replaced = [&](const std::string& file, const torch::Tensor& value) {
    io::NamedTensors state = adamw->state_tensors();
    for (auto& [name, tensor] : state) {
      if (name == "matrix/exp_avg") tensor = value;
    }
    const std::string path = (dir / file).string();
    io::save_safetensors(path, state, {{"optimizer", "adamw"}});
    auto fresh = make("adamw", decay_and_bias(a, 0.01));
    return testing::expected_error([&] { fresh->load_state_tensors(io::load_safetensors(path), path); });
  };
  const torch::Tensor shape_of = a.matrix.detach();
  const std::string as_int = replaced("int.safetensors", torch::ones_like(shape_of, torch::kInt32));
  EXPECT_TRUE(testing::Contains(as_int, (dir / "int.safetensors").string() + ": tensor 'matrix/exp_avg' is stored as I32"));
  EXPECT_TRUE(testing::Contains(as_int, "expected F32"));
  const std::string as_nan = replaced("nan.safetensors", torch::full_like(shape_of, NAN));
  EXPECT_TRUE(testing::Contains(as_nan, (dir / "nan.safetensors").string() + ": tensor 'matrix/exp_avg' holds " +
                                            std::to_string(shape_of.numel()) + " non-finite values"));
}

TEST(GradNormTest, ClippingEqualsTorchClipGradNorm) {
  auto mine = random_params(7, torch::kFloat64), reference = random_params(7, torch::kFloat64);
  set_random_grads({mine.matrix, mine.bias}, 0);
  set_random_grads({reference.matrix, reference.bias}, 0);
  const std::vector<Param> params = {{"matrix", mine.matrix, nullptr, true}, {"bias", mine.bias, nullptr, true}};
  const double ours = optim::clip_grad_norm(params, 1.5, nullptr);
  const double theirs = torch::nn::utils::clip_grad_norm_({reference.matrix, reference.bias}, 1.5);
  EXPECT_NEAR(ours, theirs, 1e-12 * theirs);
  EXPECT_TRUE(torch::allclose(mine.matrix.grad(), reference.matrix.grad(), 1e-14, 0));
  EXPECT_TRUE(torch::allclose(mine.bias.grad(), reference.bias.grad(), 1e-14, 0));
  // A non-finite gradient gives a non-finite norm and leaves the gradients alone.
  mine.bias.mutable_grad()[0] = std::numeric_limits<double>::infinity();
  const torch::Tensor before = mine.matrix.grad().clone();
  EXPECT_FALSE(std::isfinite(optim::clip_grad_norm(params, 1.5, nullptr)));
  EXPECT_TRUE(torch::equal(mine.matrix.grad(), before));
}

// float32 gradients on every device (a GPU's norms take one multi-tensor launch): torch's norm sums in
// float32, ours in float64, so they agree to float32 rounding (1e-6 relative).
TEST(GradNormTest, Float32NormsOnEveryDeviceEqualTorchs) {
  for (const torch::Device& device : testing::devices_to_test()) {
    SCOPED_TRACE(device.str());
    auto mine = random_params(8, torch::kFloat32, device), reference = random_params(8, torch::kFloat32, device);
    set_random_grads({mine.matrix, mine.bias}, 1);
    set_random_grads({reference.matrix, reference.bias}, 1);
    const std::vector<Param> params = {{"matrix", mine.matrix, nullptr, true}, {"bias", mine.bias, nullptr, true}};
    const double ours = optim::clip_grad_norm(params, 1.5, nullptr);
    const double theirs = torch::nn::utils::clip_grad_norm_({reference.matrix, reference.bias}, 1.5);
    EXPECT_NEAR(ours, theirs, 1e-6 * theirs);
    EXPECT_TRUE(torch::allclose(mine.matrix.grad(), reference.matrix.grad(), 1e-5, 0));
  }
}

}  // namespace
}  // namespace kuafu

// The noise schedule and the samplers against diffusers (tests/python/diffusers_scheduler_reference.py)
// on three configs: Stable Diffusion 1.x's (scaled linear, leading spacing, steps_offset 1), zero
// terminal SNR with v-prediction and trailing spacing, and Glide's cosine with linspace spacing and x̂₀
// clipped. Kuafu keeps ᾱ in float64 where diffusers keeps float32: ᾱ equals diffusers' formulas run in
// float64 to 1e-12 relative and diffusers' float32 ᾱ to 5e-5 relative (1,000 float32 products, worst in
// the cosine schedule's tail where ᾱ ~ 1e-9); a step's output agrees to 1e-5 (float32 samples); timestep
// lists exactly. And the traps:
// the previous timestep comes from the list, the offset never passes the schedule, Min-SNR's weights
// per prediction type with no division by zero at a zero-SNR terminal step.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include "apps/stable_diffusion/samplers.h"
#include "tests/support/reference_outputs.h"

namespace kuafu::sd {
namespace {

const testing::Reference& scheduler_reference() {
  static const testing::Reference r = testing::build_reference("diffusers_scheduler_reference.py", "sd_schedulers");
  return r;
}


SchedulerConfig config_named(const std::string& name) {
  SchedulerConfig c;
  if (name == "sd15") {
    c.beta_start = 0.00085;
    c.beta_end = 0.012;
    c.beta_schedule = BetaSchedule::kScaledLinear;
    c.steps_offset = 1;
    c.set_alpha_to_one = false;
    c.clip_sample = false;
  } else if (name == "zero_snr_v") {
    c.rescale_betas_zero_snr = true;
    c.timestep_spacing = TimestepSpacing::kTrailing;
    c.prediction_type = Prediction::kVPrediction;
    c.clip_sample = false;
  } else {
    c.beta_schedule = BetaSchedule::kSquaredCosCapV2;
    c.timestep_spacing = TimestepSpacing::kLinspace;
  }
  return c;
}

class SchedulerTest : public ::testing::TestWithParam<std::string> {
 protected:
  const testing::Reference& ref = scheduler_reference();
  NoiseSchedule schedule{config_named(GetParam())};
  torch::Tensor figure(const std::string& name) const { return ref[GetParam() + "/" + name]; }
  // The sampler's timestep lists, σ, initial noise and 10-step loop against the reference's `prefix`_* figures.
  // timestep_tolerance: absolute (0: the lists exactly); step_tolerance: of each step's largest value.
  void expect_sigma_loop(const std::string& prefix, SamplerKind kind, const NoiseSchedule& on, double timestep_tolerance = 0,
                         double step_tolerance = 1e-5) const;
};

double relative_difference(const torch::Tensor& ours, const torch::Tensor& expected) {
  return ((ours - expected).abs() / expected.abs().clamp_min(1e-300)).max().item<double>();
}

TEST_P(SchedulerTest, AlphasCumprodEqualDiffusers) {
  EXPECT_LT(relative_difference(schedule.alphas_cumprod(), figure("alphas_cumprod_f64")), 1e-12);
  EXPECT_LT(relative_difference(schedule.alphas_cumprod(), figure("alphas_cumprod")), 5e-5);
}

TEST_P(SchedulerTest, TimestepsAreDiffusersListsExactly) {
  for (const int64_t n : {1, 2, 3, 7, 10, 30, 50, 333, 999, 1000}) {
    if (GetParam() == "sd15" && n == 1000) continue;  // diffusers' list passes the schedule there (below)
    const torch::Tensor expected = figure("timesteps_" + std::to_string(n));
    EXPECT_EQ(schedule.timesteps(n), std::vector<int64_t>(expected.data_ptr<int64_t>(), expected.data_ptr<int64_t>() + expected.numel()))
        << n << " steps";
  }
}

// DDIM's step from each timestep of a 10-step schedule (the same x_t, one model output per step) equals
// DDIM's eq. 12 stepping to the list's next timestep, and diffusers' own step wherever its t − T/N is
// that timestep (leading, trailing); under linspace diffusers lands off the list (999 -> 899 where the
// list says 888) and differs.
TEST_P(SchedulerTest, DdimStepsToTheListsNextTimestep) {
  DdimSampler ddim(schedule, 10);
  const torch::Tensor sample = figure("sample"), outputs = figure("outputs");
  std::vector<torch::Tensor> steps;
  for (size_t i = 0; i < 10; ++i) steps.push_back(ddim.step(outputs[static_cast<int64_t>(i)], i, sample));
  const torch::Tensor ours = torch::stack(steps);
  EXPECT_LT(testing::max_abs_difference(ours, figure("ddim_listed")), 1e-5);
  if (GetParam() == "cosine_linspace") {
    EXPECT_GT(testing::max_abs_difference(figure("ddim_diffusers"), figure("ddim_listed")), 1e-2) << "the trap this avoids";
  } else {
    EXPECT_LT(testing::max_abs_difference(ours, figure("ddim_diffusers")), 1e-5);
  }
}

// DDPM's step with its noise drawn as diffusers draws it (a CPU generator seeded 100 + i, one randn of the
// sample's shape): the same x_prev, the last step at timestep 0 (or 1) included.
TEST_P(SchedulerTest, DdpmStepsEqualDiffusersFromTheSameGenerator) {
  DdpmSampler ddpm(schedule, 10);
  const torch::Tensor sample = figure("sample"), outputs = figure("outputs");
  std::vector<torch::Tensor> steps;
  for (size_t i = 0; i < 10; ++i) {
    const at::Generator generator = at::detail::createCPUGenerator(100 + i);
    const torch::Tensor noise = torch::randn(sample.sizes(), generator, torch::kFloat32);
    steps.push_back(ddpm.step(outputs[static_cast<int64_t>(i)], i, sample, noise));
  }
  EXPECT_LT(testing::max_abs_difference(torch::stack(steps), figure("ddpm")), 1e-5);
}

TEST_P(SchedulerTest, NoisingTargetsAndMinSnrWeightsEqualTheReference) {
  const torch::Tensor rows = torch::tensor({10, 900}), x0 = figure("sample"), noise = figure("outputs")[0];
  EXPECT_LT(testing::max_abs_difference(schedule.add_noise(x0, noise, rows), figure("noised")), 1e-5);
  if (schedule.config().prediction_type == Prediction::kVPrediction) {
    EXPECT_LT(testing::max_abs_difference(schedule.training_target(x0, noise, rows), figure("velocity")), 1e-5);
  } else {
    EXPECT_TRUE(schedule.training_target(x0, noise, rows).equal(noise));
  }
  const torch::Tensor all = torch::arange(schedule.train_timesteps());
  const torch::Tensor snr = figure("snr");
  const torch::Tensor positive = snr > 0;  // the reference's 0/0 at a zero-SNR step is checked by hand below
  const torch::Tensor ours = schedule.min_snr_weights(all, 5.0);
  EXPECT_LT(relative_difference(ours.index({positive}), figure("min_snr_5").index({positive})), 1e-10);
  EXPECT_TRUE(torch::isfinite(ours).all().item<bool>());
}

// Euler discrete and DPM-Solver++(2M) as diffusers runs them: their own timestep lists, σ, the initial
// noise scale, Euler's scaled model input, and a 10-step loop (each step from the previous one, so
// DPM-Solver's second-order steps see its previous estimate) from the same initial latents with the same
// model outputs: every step's x to 1e-5 of its largest value (float32 chains; σ reaches 2·10⁴ in the
// cosine schedule's tail). Where diffusers' leading list with steps_offset passes the schedule (999 and
// 1,000 DPM-Solver steps), Kuafu's stays within it.
void SchedulerTest::expect_sigma_loop(const std::string& prefix, SamplerKind kind, const NoiseSchedule& on,
                                      double timestep_tolerance, double step_tolerance) const {
  const torch::Tensor sample = figure("sample"), outputs = figure(kind == SamplerKind::kHeun ? "heun_outputs" : "outputs");
  for (const int64_t n : {1, 2, 3, 7, 10, 30, 50, 333, 999, 1000}) {
    const std::vector<double> ours = make_sampler(kind, on, n)->timesteps();
    if (on.config().steps_offset != 0 && n >= 999) {  // diffusers' list passes the schedule there; ours stays
      EXPECT_LT(ours.front(), static_cast<double>(on.train_timesteps())) << prefix << " " << n << " steps";
      continue;
    }
    const torch::Tensor expected = figure(prefix + "_timesteps_" + std::to_string(n));
    const std::vector<double> theirs(expected.data_ptr<double>(), expected.data_ptr<double>() + expected.numel());
    if (timestep_tolerance == 0) {
      const auto differs = std::mismatch(ours.begin(), ours.end(), theirs.begin(), theirs.end());
      EXPECT_EQ(ours, theirs) << prefix << " " << n << " steps, first difference at step "
                              << (differs.first - ours.begin());
    } else {
      ASSERT_EQ(ours.size(), theirs.size()) << prefix << " " << n << " steps";
      EXPECT_LE(testing::max_abs_difference(torch::tensor(ours, torch::kFloat64), expected), timestep_tolerance)
          << prefix << " " << n << " steps";
    }
  }
  const std::unique_ptr<Sampler> sampler = make_sampler(kind, on, 10);
  const auto& sigmas = dynamic_cast<const SigmaSampler&>(*sampler).sigmas();
  // 5e-4: diffusers' float32 1 − ᾱ near ᾱ = 1 (the cosine schedule's σ at t = 0) keeps few digits.
  EXPECT_LT(relative_difference(torch::tensor(sigmas, torch::kFloat64), figure(prefix + "_sigmas")), 5e-4) << prefix;
  const double init = figure(prefix + "_init_noise_sigma").item<double>();
  EXPECT_NEAR(sampler->init_noise_sigma(), init, 1e-5 * init) << prefix;
  torch::Tensor x = sample * sampler->init_noise_sigma();
  ASSERT_EQ(static_cast<int64_t>(sampler->timesteps().size()), outputs.size(0)) << prefix;  // Heun: 19 calls
  for (size_t i = 0; i < sampler->timesteps().size(); ++i) {
    const auto row = static_cast<int64_t>(i);
    if (kind == SamplerKind::kEuler || kind == SamplerKind::kHeun) {
      const torch::Tensor input = figure(prefix + "_inputs")[row];
      EXPECT_LT(testing::max_abs_difference(sampler->scale_model_input(x, i), input), step_tolerance * input.abs().max().item<double>())
          << prefix << " input " << i;
    }
    x = sampler->step(outputs[row], i, x);
    const torch::Tensor expected = figure(prefix + "_steps")[row];
    EXPECT_LT(testing::max_abs_difference(x, expected), step_tolerance * std::max(1.0, expected.abs().max().item<double>()))
        << prefix << " step " << i;
  }
}

// Both samplers on the schedule as configured.
TEST_P(SchedulerTest, EulerAndDpmSolverLoopsEqualDiffusers) {
  for (const auto& [prefix, kind] : {std::pair<std::string, SamplerKind>{"euler", SamplerKind::kEuler}, {"dpm", SamplerKind::kDpmSolverPlusPlus2M}}) {
    expect_sigma_loop(prefix, kind, schedule);
  }
}

// UniPC (bh2, order 2, a corrector after every model call but the first, order 1 at the last step) as
// diffusers' UniPCMultistepScheduler runs it, with its lists and σ (DPM-Solver's) and with Karras σ (its
// timesteps rounded under every schedule): the same checks and tolerances as DPM-Solver's above.
TEST_P(SchedulerTest, UniPcLoopsEqualDiffusers) {
  expect_sigma_loop("unipc", SamplerKind::kUniPc, schedule);
  SchedulerConfig karras = schedule.config();
  karras.karras_sigmas = true;
  const NoiseSchedule with_karras(karras);
  expect_sigma_loop("unipc_karras", SamplerKind::kUniPc, with_karras, /*timestep_tolerance=*/1.0,
                    GetParam() == "cosine_linspace" ? 1e-4 : 3e-5);
}

// The same with Karras et al.'s σ (diffusers' use_karras_sigmas): Euler's ρ = 7 spacing between its first and
// last σ, each called at the fractional timestep of its σ; DPM-Solver's over the whole schedule, its
// timesteps rounded (truncated under the cosine schedule). The timestep of a σ is log σ interpolated in
// diffusers' float32 σ, whose 1 − ᾱ keeps few digits near ᾱ = 1 (σ 5e-4 apart above): Euler's timesteps to
// 0.05 (measured 0.037, at the cosine schedule's t < 1), DPM-Solver's rounded ones to 1 (a few of the long
// lists fall on the other side of a half; those of 1, 10 and 50 steps are exact). Inputs and steps to 3e-5
// of their largest value under SD's and the zero-SNR schedules (float32 arithmetic at σ up to 4,096;
// measured 1.5e-5), 1e-4 under the cosine one: every Karras σ is spaced from σ_max, and diffusers' float32
// ᾱ at its end is 5e-5 from the float64 one (AlphasCumprodEqualDiffusers; measured 7.4e-5).
TEST_P(SchedulerTest, KarrasSigmaLoopsEqualDiffusers) {
  SchedulerConfig karras = schedule.config();
  karras.karras_sigmas = true;
  const NoiseSchedule with_karras(karras);
  const double step_tolerance = GetParam() == "cosine_linspace" ? 1e-4 : 3e-5;
  expect_sigma_loop("euler_karras", SamplerKind::kEuler, with_karras, /*timestep_tolerance=*/0.05, step_tolerance);
  expect_sigma_loop("dpm_karras", SamplerKind::kDpmSolverPlusPlus2M, with_karras, /*timestep_tolerance=*/1.0, step_tolerance);
  for (const int64_t n : {1, 10, 50}) {  // lists of the usual lengths: exactly diffusers'
    const torch::Tensor expected = figure("dpm_karras_timesteps_" + std::to_string(n));
    EXPECT_EQ(make_sampler(SamplerKind::kDpmSolverPlusPlus2M, with_karras, n)->timesteps(),
              std::vector<double>(expected.data_ptr<double>(), expected.data_ptr<double>() + expected.numel()))
        << n << " steps";
  }
}

// Heun's method as diffusers' HeunDiscreteScheduler runs it: Euler's σ with each after the first called twice
// (19 model calls for 10 steps, each given its own output), the lists, σ, inputs and every x as Euler's above,
// also with Karras σ (Euler's tolerances). diffusers' Heun has no zero-SNR schedule, and Kuafu's refuses one.
TEST_P(SchedulerTest, HeunLoopsEqualDiffusers) {
  if (schedule.config().rescale_betas_zero_snr) {
    const std::string message = testing::error_message([&] { make_sampler(SamplerKind::kHeun, schedule, 10); });
    EXPECT_NE(message.find("zero-SNR"), std::string::npos) << message;
    return;
  }
  expect_sigma_loop("heun", SamplerKind::kHeun, schedule);
  SchedulerConfig karras = schedule.config();
  karras.karras_sigmas = true;
  const NoiseSchedule with_karras(karras);
  expect_sigma_loop("heun_karras", SamplerKind::kHeun, with_karras, /*timestep_tolerance=*/0.05,
                    GetParam() == "cosine_linspace" ? 1e-4 : 3e-5);
}

// Euler ancestral (k-diffusion's step to σ_down, then σ_up noise) as diffusers' EulerAncestralDiscreteScheduler
// runs it: Euler's timesteps and σ (checked above), and its 10-step loop with step i's noise drawn as diffusers
// draws it (a CPU generator seeded 200 + i), every x to 1e-5 of its largest value as above.
TEST_P(SchedulerTest, EulerAncestralLoopEqualsDiffusersFromTheSameGenerator) {
  const torch::Tensor sample = figure("sample"), outputs = figure("outputs");
  const std::unique_ptr<Sampler> sampler = make_sampler(SamplerKind::kEulerAncestral, schedule, 10);
  EXPECT_TRUE(sampler->stochastic());
  torch::Tensor x = sample * sampler->init_noise_sigma();
  for (size_t i = 0; i < 10; ++i) {
    const at::Generator generator = at::detail::createCPUGenerator(200 + i);
    x = sampler->step(outputs[static_cast<int64_t>(i)], i, x, torch::randn(sample.sizes(), generator, torch::kFloat32));
    const torch::Tensor expected = figure("euler_a_steps")[static_cast<int64_t>(i)];
    EXPECT_LT(testing::max_abs_difference(x, expected), 1e-5 * std::max(1.0, expected.abs().max().item<double>())) << "step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, SchedulerTest, ::testing::Values("sd15", "zero_snr_v", "cosine_linspace"));

TEST(SchedulerTraps, FiftyLeadingStepsWithOffsetOneAre981To1) {
  SchedulerConfig c = config_named("sd15");
  const std::vector<int64_t> t = NoiseSchedule(c).timesteps(50);
  ASSERT_EQ(t.size(), 50u);
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(t[i], 981 - 20 * static_cast<int64_t>(i));
}

// 1,000 leading steps with steps_offset 1 would start at timestep 1000 (diffusers indexes ᾱ_1000 there):
// the offset is cut to keep 999 .. 0, and a whole DDIM loop runs with every value finite.
TEST(SchedulerTraps, AThousandStepsNeverIndexPastTheSchedule) {
  const NoiseSchedule schedule(config_named("sd15"));
  DdimSampler ddim(schedule, 1000);
  ASSERT_EQ(ddim.timesteps().front(), 999);
  ASSERT_EQ(ddim.timesteps().back(), 0);
  torch::manual_seed(0);
  torch::Tensor x = torch::randn({1, 4, 4, 4});
  for (size_t i = 0; i < ddim.timesteps().size(); ++i) x = ddim.step(0.1 * x, i, x);
  EXPECT_TRUE(torch::isfinite(x).all().item<bool>());
}

// set_alpha_to_one false: the final step goes to ᾱ_0, not to 1 (SD's config); true: to 1, i.e. x̂₀.
TEST(SchedulerTraps, TheFinalStepGoesToAlphaZeroOrOne) {
  SchedulerConfig c = config_named("sd15");
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({1, 4, 4, 4}), eps = torch::randn({1, 4, 4, 4});
  for (const bool to_one : {false, true}) {
    c.set_alpha_to_one = to_one;
    const NoiseSchedule schedule(c);
    DdimSampler ddim(schedule, 10);
    const size_t last = ddim.timesteps().size() - 1;
    const Estimates e = schedule.estimates(eps, static_cast<int64_t>(ddim.timesteps()[last]), x);
    const double a = to_one ? 1.0 : schedule.alpha_cumprod(0);
    EXPECT_LT(testing::max_abs_difference(ddim.step(eps, last, x), std::sqrt(a) * e.x0 + std::sqrt(1 - a) * e.epsilon), 1e-6) << to_one;
  }
}

// Min-SNR-γ by prediction type: ε min(SNR, γ)/SNR, v min(SNR, γ)/(SNR + 1) (min(SNR + 1, γ)/(SNR + 1) is
// the bug: it gives 1 wherever SNR + 1 < γ), x₀ min(SNR, γ); at a zero-SNR terminal step ε's weight is its
// limit 1 and v's is 0, never NaN.
TEST(SchedulerTraps, MinSnrWeightsPerPredictionTypeAndAtZeroSnr) {
  SchedulerConfig c = config_named("zero_snr_v");
  const NoiseSchedule v(c);
  const torch::Tensor t = torch::tensor({int64_t{999}});
  EXPECT_EQ(v.snr(t).item<double>(), 0.0);
  EXPECT_EQ(v.min_snr_weights(t, 5.0).item<double>(), 0.0);
  // A step whose SNR is about 2: v's weight SNR/(SNR + 1), not 1.
  const torch::Tensor all = torch::arange(1000);
  const int64_t near_two = (v.snr(all) - 2.0).abs().argmin().item<int64_t>();
  const double snr = v.snr(torch::tensor({near_two})).item<double>();
  EXPECT_NEAR(v.min_snr_weights(torch::tensor({near_two}), 5.0).item<double>(), snr / (snr + 1), 1e-12);
  c.prediction_type = Prediction::kEpsilon;
  const NoiseSchedule eps(c);
  EXPECT_EQ(eps.min_snr_weights(t, 5.0).item<double>(), 1.0);
  EXPECT_NEAR(eps.min_snr_weights(torch::tensor({int64_t{0}}), 5.0).item<double>(), 5.0 / eps.snr(torch::tensor({int64_t{0}})).item<double>(),
              1e-12);
  c.prediction_type = Prediction::kSample;
  EXPECT_NEAR(NoiseSchedule(c).min_snr_weights(torch::tensor({near_two}), 5.0).item<double>(), snr, 1e-12);
}

// Guidance 1 is the conditional branch exactly (a + (b − a) is not b in floating point), and needs no
// unconditional pass; another scale is ε_u + g (ε_c − ε_u) (against float64: values near 10⁴ in float32).
TEST(SchedulerTraps, GuidanceOneIsTheConditionalBranchExactly) {
  torch::manual_seed(2);
  const torch::Tensor u = torch::randn({2, 4, 8, 8}), c = torch::randn({2, 4, 8, 8}) * 1e3;
  EXPECT_FALSE(needs_unconditional(1.0));
  EXPECT_TRUE(classifier_free_guidance(u, c, 1.0).equal(c));
  EXPECT_FALSE((u + (c - u)).equal(c)) << "the rounding the exact branch avoids";
  EXPECT_TRUE(needs_unconditional(7.5));
  EXPECT_LT(testing::max_abs_difference(classifier_free_guidance(u, c, 7.5), u.to(torch::kFloat64) + 7.5 * (c.to(torch::kFloat64) - u.to(torch::kFloat64))), 1e-2);
}

TEST(SchedulerTraps, BadStepCountsAndNamesAreNamed) {
  const NoiseSchedule schedule(config_named("sd15"));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { schedule.timesteps(0); }), "inference steps must be in [1, 1000]"));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { schedule.timesteps(1001); }), "got 1001"));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { timestep_spacing_named("even"); }), "leading, trailing, linspace"));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { prediction_named("x0"); }), "epsilon, v_prediction, sample"));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { beta_schedule_named("cosine"); }), "squaredcos_cap_v2"));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { sampler_named("PNDMScheduler"); }), "EulerDiscreteScheduler"));
  EXPECT_EQ(sampler_named("DPMSolverMultistepScheduler"), SamplerKind::kDpmSolverPlusPlus2M);
}

}  // namespace
}  // namespace kuafu::sd

// Learning-rate schedules against values worked by hand, and exact continuation after a resume.
#include <gtest/gtest.h>

#include <cmath>

#include "core/optim/lr_schedule.h"
#include "tests/support/test_util.h"

namespace kuafu {
namespace {

using optim::LrSchedule;
using optim::ScheduleKind;
using optim::ScheduleOptions;

ScheduleOptions options(ScheduleKind kind) {
  ScheduleOptions o;
  o.kind = kind;
  o.peak_lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 4;
  o.total_steps = 14;  // 10 decay steps after the warm-up
  return o;
}

TEST(LrScheduleTest, WarmupRisesLinearlyToThePeak) {
  const LrSchedule s(options(ScheduleKind::kCosine));
  // peak * (step + 1) / (warmup + 1): 0.2, 0.4, 0.6, 0.8, then the peak.
  for (int64_t step = 0; step < 4; ++step) EXPECT_DOUBLE_EQ(s.lr(step), 0.2 * (step + 1));
  EXPECT_DOUBLE_EQ(s.lr(4), 1.0);
}

TEST(LrScheduleTest, DecayShapesMatchTheirFormulas) {
  // Step 9 is halfway through the 10 decay steps (progress 0.5); step 14 and later are the end.
  const LrSchedule cosine(options(ScheduleKind::kCosine));
  EXPECT_DOUBLE_EQ(cosine.lr(9), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5)));  // 0.55
  EXPECT_DOUBLE_EQ(cosine.lr(14), 0.1);
  EXPECT_DOUBLE_EQ(cosine.lr(100), 0.1);

  const LrSchedule linear(options(ScheduleKind::kLinear));
  EXPECT_DOUBLE_EQ(linear.lr(9), 0.55);
  EXPECT_DOUBLE_EQ(linear.lr(6), 0.1 + 0.9 * 0.8);  // progress 0.2

  ScheduleOptions poly = options(ScheduleKind::kPolynomial);
  poly.power = 2.0;
  EXPECT_DOUBLE_EQ(LrSchedule(poly).lr(9), 0.1 + 0.9 * 0.25);  // (1 - 0.5)^2

  const LrSchedule constant(options(ScheduleKind::kConstant));
  EXPECT_DOUBLE_EQ(constant.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(constant.lr(1000), 1.0);

  ScheduleOptions multi = options(ScheduleKind::kMultiStep);
  multi.milestones = {6, 10};
  multi.gamma = 0.5;
  const LrSchedule steps(multi);
  EXPECT_DOUBLE_EQ(steps.lr(5), 1.0);
  EXPECT_DOUBLE_EQ(steps.lr(6), 0.5);   // the milestone step itself already uses the lower rate
  EXPECT_DOUBLE_EQ(steps.lr(9), 0.5);
  EXPECT_DOUBLE_EQ(steps.lr(10), 0.25);
}

TEST(LrScheduleTest, ResumedScheduleContinuesExactly) {
  // A schedule is a function of the step alone: one rebuilt from the same options after a restart
  // at step 7 gives bitwise the rates the uninterrupted one gives.
  for (const auto& name : LrSchedule::kind_names()) {
    ScheduleOptions o = options(LrSchedule::parse_kind(name));
    o.milestones = {8};
    const LrSchedule before(o), after(o);
    for (int64_t step = 7; step < 20; ++step) EXPECT_EQ(before.lr(step), after.lr(step)) << name;
  }
}

TEST(LrScheduleTest, InconsistentOptionsAreRefused) {
  ScheduleOptions o = options(ScheduleKind::kCosine);
  o.min_lr = 2.0;
  EXPECT_NE(testing::error_message([&] { LrSchedule{o}; }).find("exceeds the peak"), std::string::npos);
  o = options(ScheduleKind::kMultiStep);
  o.milestones = {10, 5};
  EXPECT_NE(testing::error_message([&] { LrSchedule{o}; }).find("ascending"), std::string::npos);
  EXPECT_NE(testing::error_message([] { LrSchedule::parse_kind("cosin"); }).find("cosin"), std::string::npos);
}

}  // namespace
}  // namespace kuafu

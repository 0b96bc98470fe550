// The dynamic loss scaler on scripted overflow sequences: growth after a clean interval, hysteresis
// before the first back-off, the bounds, and a saved state that resumes the same sequence.
#include <gtest/gtest.h>

#include "core/optim/loss_scaler.h"
#include "tests/support/test_util.h"

namespace kuafu {
namespace {

optim::LossScalerOptions small() {
  optim::LossScalerOptions o;
  o.initial_scale = 1024;
  o.growth_factor = 2;
  o.backoff_factor = 0.5;
  o.growth_interval = 3;
  o.hysteresis = 2;
  o.min_scale = 64;
  o.max_scale = 4096;
  return o;
}

// The scale after each update of `overflows` ("x" = overflow, "." = clean step).
std::vector<double> run(optim::DynamicLossScaler& scaler, const std::string& overflows) {
  std::vector<double> scales;
  for (char c : overflows) {
    scaler.update(c == 'x');
    scales.push_back(scaler.scale());
  }
  return scales;
}

TEST(LossScalerTest, GrowsAfterACleanIntervalAndToleratesOneOverflow) {
  optim::DynamicLossScaler scaler(small());
  // Three clean steps: x2. An overflow uses up hysteresis (2 -> 1) without backing off and restarts
  // the growth count; the second overflow backs off; the scale grows again after 3 clean steps.
  EXPECT_EQ(run(scaler, "...x.x..."), (std::vector<double>{1024, 1024, 2048, 2048, 2048, 1024, 1024, 1024, 2048}));
  EXPECT_EQ(scaler.skipped_steps(), 2);
}

TEST(LossScalerTest, OnceHysteresisIsUsedUpEveryOverflowBacksOffUntilGrowth) {
  optim::DynamicLossScaler scaler(small());
  // x: hysteresis 1, scale kept; x: 0, back-off; x, x: back-off each (not below 64); ... : growth
  // refills the hysteresis, so the next single overflow is tolerated again.
  EXPECT_EQ(run(scaler, "xxxxx...x"), (std::vector<double>{1024, 512, 256, 128, 64, 64, 64, 128, 128}));
}

TEST(LossScalerTest, GrowthStopsAtTheMaximum) {
  optim::DynamicLossScaler scaler(small());
  EXPECT_EQ(run(scaler, "........."), (std::vector<double>{1024, 1024, 2048, 2048, 2048, 4096, 4096, 4096, 4096}));
}

TEST(LossScalerTest, SavedStateResumesTheSameSequence) {
  optim::DynamicLossScaler whole(small()), first(small());
  const std::string script = "..x.x.....xx...";
  run(whole, script.substr(0, 7));
  run(first, script.substr(0, 7));
  const nlohmann::json saved = nlohmann::json::parse(first.state().dump());
  optim::DynamicLossScaler resumed(small());
  resumed.load_state(saved);
  EXPECT_EQ(run(resumed, script.substr(7)), run(whole, script.substr(7)));
  EXPECT_EQ(resumed.skipped_steps(), whole.skipped_steps());
}

// Before: a scale stuck at its floor skipped every step for ever. Three overflows in a row at the floor
// stop the run (a clean step restarts the count), and the count survives a checkpoint.
TEST(LossScalerTest, OverflowingAtTheFloorStopsTheRun) {
  optim::LossScalerOptions o = small();
  o.max_overflows_at_min = 3;
  optim::DynamicLossScaler scaler(o);
  run(scaler, "xxxxx");  // 1024 (hysteresis), 512, 256, 128, 64: the floor
  run(scaler, "xx.xx");  // two at the floor, a clean step, two more
  EXPECT_EQ(scaler.scale(), 64);
  optim::DynamicLossScaler resumed(o);
  resumed.load_state(scaler.state());
  for (optim::DynamicLossScaler* s : {&scaler, &resumed}) {
    const std::string message = testing::error_message([&] { s->update(true); });
    EXPECT_TRUE(testing::Contains(message, "stayed at its floor (precision.min_scale = 64) for 3 overflowing steps in a row"));
  }
}

TEST(LossScalerTest, BadOptionsAndStateAreRefused) {
  auto o = small();
  o.min_scale = 4096 * 2;
  EXPECT_NE(testing::error_message([&] { optim::DynamicLossScaler{o}; }).find("min_scale"), std::string::npos);
  optim::DynamicLossScaler scaler(small());
  // Says what it expected and what it found (it used to pass the JSON library's text on).
  const std::string incomplete = testing::error_message([&] { scaler.load_state({{"scale", 2.0}}); });
  EXPECT_NE(incomplete.find("loss scaler state: expected a number \"scale\""), std::string::npos) << incomplete;
  EXPECT_NE(incomplete.find("found {\"scale\":2.0}"), std::string::npos) << incomplete;
  EXPECT_NE(testing::error_message([&] {
              scaler.load_state({{"scale", -1.0}, {"clean_steps", 0}, {"hysteresis_left", 1}, {"skipped_steps", 0}});
            }).find("not a positive"),
            std::string::npos);
}

}  // namespace
}  // namespace kuafu

// Gemini's rules without tensors: the chunk tensor state machine accepts exactly its legal transitions,
// eviction picks the chunk whose next use is furthest ahead on a scripted access pattern, and the tier
// ledger refuses what would exceed a budget (activations included) and keeps the peak.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/memory/eviction.h"
#include "core/memory/tensor_state.h"
#include "core/memory/tier_ledger.h"
#include "core/util/error.h"
#include "tests/support/test_util.h"

namespace kuafu::memory {
namespace {

using S = TensorState;

TEST(TensorStateTest, OnlyTheLegalTransitionsAreAllowed) {
  const std::vector<S> all = {S::kFree, S::kHold, S::kCompute, S::kHoldAfterBackward, S::kReadyForReduce};
  const std::vector<std::pair<S, S>> legal = {
      {S::kFree, S::kHold},          {S::kHold, S::kCompute},
      {S::kHold, S::kFree},          {S::kCompute, S::kHold},
      {S::kCompute, S::kHoldAfterBackward}, {S::kHoldAfterBackward, S::kCompute},
      {S::kHoldAfterBackward, S::kReadyForReduce}, {S::kReadyForReduce, S::kHold}};
  for (S from : all) {
    for (S to : all) {
      const bool expected = std::find(legal.begin(), legal.end(), std::make_pair(from, to)) != legal.end();
      EXPECT_EQ(legal_transition(from, to), expected) << state_name(from) << " -> " << state_name(to);
    }
  }
}

TEST(TensorStateTest, AnIllegalTransitionNamesTheTensorAndBothStates) {
  try {
    check_transition("h.0.attn.c_attn.weight", S::kFree, S::kCompute);
    FAIL() << "computing on a released tensor was allowed";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("h.0.attn.c_attn.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("free -> compute"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(check_transition("w", S::kHoldAfterBackward, S::kReadyForReduce));
}

TEST(TensorStateTest, OnlyFreeAndHeldChunksMayMove) {
  EXPECT_TRUE(movable(S::kFree));
  EXPECT_TRUE(movable(S::kHold));
  EXPECT_FALSE(movable(S::kCompute));
  EXPECT_FALSE(movable(S::kHoldAfterBackward));
  EXPECT_FALSE(movable(S::kReadyForReduce));
}

TEST(EvictionTest, NextUseWrapsIntoTheNextStep) {
  const AccessTrace trace({0, 1, 2, 0, 1, 3, 0, 2});
  EXPECT_EQ(trace.next_use(0, 0), 3);
  EXPECT_EQ(trace.next_use(1, 5), 9);   // positions 1 and 4 are past: next step's 1
  EXPECT_EQ(trace.next_use(3, 13), 21);  // second step (8..15): 3 sits at 13, next at 16 + 5
  EXPECT_EQ(trace.next_use(7, 0), -1);
}

// Step 0 1 2 0 1 3 0 2 with room for two chunks. Worked by hand:
//   pos 2 needs 2, holds {0, 1}: next uses 0 -> 3, 1 -> 4: evict 1
//   pos 4 needs 1, holds {0, 2}: 0 -> 6, 2 -> 7: evict 2
//   pos 5 needs 3, holds {0, 1}: 0 -> 6, 1 -> 9 (next step): evict 1
//   pos 7 needs 2, holds {0, 3}: 0 -> 8, 3 -> 13: evict 3
TEST(EvictionTest, FurthestNextUseOnAScriptedPattern) {
  const AccessTrace trace({0, 1, 2, 0, 1, 3, 0, 2});
  std::vector<int64_t> resident, evicted;
  for (int64_t now = 0; now < static_cast<int64_t>(trace.accesses().size()); ++now) {
    const int64_t chunk = trace.accesses()[now];
    if (std::find(resident.begin(), resident.end(), chunk) != resident.end()) continue;
    if (resident.size() == 2) {
      const int64_t victim = furthest_next_use(resident, trace, now);
      evicted.push_back(victim);
      resident.erase(std::find(resident.begin(), resident.end(), victim));
    }
    resident.push_back(chunk);
  }
  EXPECT_EQ(evicted, (std::vector<int64_t>{1, 2, 1, 3}));
}

TEST(EvictionTest, AChunkNeverUsedAgainGoesFirst) {
  const AccessTrace trace({0, 1, 0, 1});
  EXPECT_EQ(furthest_next_use({0, 1, 9}, trace, 0), 9);
  EXPECT_THROW(furthest_next_use({}, trace, 0), Error);
}

TEST(TierLedgerTest, TheFastBudgetCountsActivationsAndRefusesOverflow) {
  TierLedger ledger({/*fast=*/1000, /*slow=*/0});
  ledger.add(Tier::kFast, 600, "chunk 0");
  ledger.set_non_model(300);
  EXPECT_TRUE(ledger.fits(Tier::kFast, 100));   // 600 + 300 + 100 = 1000
  EXPECT_FALSE(ledger.fits(Tier::kFast, 101));
  EXPECT_TRUE(ledger.fits(Tier::kSlow, int64_t{1} << 40));  // unlimited
  const std::string message = testing::error_message([&] { ledger.add(Tier::kFast, 200, "chunk 7"); });
  EXPECT_NE(message.find("chunk 7"), std::string::npos) << message;
  EXPECT_NE(message.find("memory.device_budget_mb"), std::string::npos) << message;
  EXPECT_EQ(ledger.model_bytes(Tier::kFast), 600);  // the refused bytes were not entered
  ledger.add(Tier::kFast, 100, "chunk 1");
  EXPECT_EQ(ledger.peak_bytes(Tier::kFast), 1000);
  ledger.remove(Tier::kFast, 700);
  ledger.set_non_model(50);
  EXPECT_EQ(ledger.peak_bytes(Tier::kFast), 1000);  // the peak stays
  EXPECT_EQ(ledger.peak_non_model_bytes(), 300);
  EXPECT_THROW(ledger.remove(Tier::kFast, 1), Error);  // more freed than held
}

TEST(TierLedgerTest, TheHostBudgetIsEnforcedToo) {
  TierLedger ledger({0, 500});
  ledger.add(Tier::kSlow, 500, "masters of chunk 0");
  const std::string message = testing::error_message([&] { ledger.add(Tier::kSlow, 1, "masters of chunk 1"); });
  EXPECT_NE(message.find("memory.host_budget_mb"), std::string::npos) << message;
  EXPECT_TRUE(ledger.fits(Tier::kFast, int64_t{1} << 40));
}

}  // namespace
}  // namespace kuafu::memory

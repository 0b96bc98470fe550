#include "core/io/epoch_order.h"

#include <gtest/gtest.h>

#include <set>

#include "core/util/error.h"

namespace kuafu::io {
namespace {

// 10 items in batches of 4: 2 steps per epoch, 2 items left out each epoch (drop-last).
TEST(EpochOrderTest, EachEpochIsAShuffleWhoseBatchesNeverRepeatAnItem) {
  EpochOrder order(10, 4, 7);
  ASSERT_EQ(order.steps_per_epoch(), 2);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<size_t> seen;
    for (int64_t step = 2 * epoch; step < 2 * epoch + 2; ++step) {
      for (size_t item : order.rows(step, 0, 4)) {
        EXPECT_LT(item, 10u);
        EXPECT_TRUE(seen.insert(item).second) << "item " << item << " twice in epoch " << epoch;
      }
    }
    EXPECT_EQ(seen.size(), 8u);
  }
  // Another epoch, another order (the chance that two shuffles of 10 agree on 8 places is negligible).
  EXPECT_NE(order.rows(0, 0, 4), order.rows(2, 0, 4));
}

// A resumed run (a fresh order jumping to any step) and a rank taking part of the rows see exactly
// what the straight run sees.
TEST(EpochOrderTest, AnyStepsRowsFollowFromItsNumberAlone) {
  EpochOrder straight(10, 4, 7);
  std::vector<std::vector<size_t>> batches;
  for (int64_t step = 0; step < 6; ++step) batches.push_back(straight.rows(step, 0, 4));
  EpochOrder resumed(10, 4, 7);
  for (int64_t step = 5; step >= 0; --step) {
    std::vector<size_t> halves = resumed.rows(step, 0, 2);
    const std::vector<size_t> second = resumed.rows(step, 2, 2);
    halves.insert(halves.end(), second.begin(), second.end());
    EXPECT_EQ(halves, batches[static_cast<size_t>(step)]) << "step " << step;
  }
  EXPECT_NE(EpochOrder(10, 4, 8).rows(0, 0, 4), batches[0]);  // the seed matters
}

TEST(EpochOrderTest, ASetSmallerThanABatchAndRowsOutsideTheBatchAreRefused) {
  EXPECT_THROW(EpochOrder(3, 4, 0), Error);
  EpochOrder order(10, 4, 0);
  EXPECT_THROW(order.rows(0, 3, 2), Error);
}

}  // namespace
}  // namespace kuafu::io

#include "core/io/epoch_order.h"

#include <gtest/gtest.h>

#include <set>

#include "core/util/error.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {

using kuafu::testing::Contains;
using kuafu::testing::expected_error;

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

// Groups (aspect buckets) of 5, 2 and 1 items and an unreadable one (-1), in global batches of 2: each group's last
// batch is filled up with its first items of the epoch's shuffle, so 3 + 1 + 1 = 5 steps see every readable item.
TEST(GroupedEpochOrderTest, EveryBatchIsOneGroupAndEveryItemIsSeenEachEpoch) {
  const std::vector<int64_t> groups = {0, 0, 0, 0, 0, 1, 1, -1, 2};
  GroupedEpochOrder order(groups, 2, 7);
  ASSERT_EQ(order.steps_per_epoch(), 5);
  std::vector<std::vector<size_t>> first_epoch;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::multiset<size_t> seen;
    std::multiset<int64_t> batch_groups;
    for (int64_t step = 5 * epoch; step < 5 * epoch + 5; ++step) {
      const std::vector<size_t> rows = order.rows(step, 0, 2);
      if (epoch == 0) first_epoch.push_back(rows);
      batch_groups.insert(order.group(step));
      for (const size_t item : rows) {
        ASSERT_LT(item, groups.size());
        EXPECT_EQ(groups[item], order.group(step)) << "step " << step << " item " << item;
        seen.insert(item);
      }
    }
    EXPECT_EQ(batch_groups, (std::multiset<int64_t>{0, 0, 0, 1, 2})) << "epoch " << epoch;
    for (const size_t item : {0, 1, 2, 3, 4, 5, 6, 8}) EXPECT_GE(seen.count(item), 1u) << "item " << item << " in epoch " << epoch;
    EXPECT_EQ(seen.count(7), 0u) << "an unreadable item is never drawn";
    EXPECT_EQ(seen.count(8), 2u) << "the lone item of group 2 fills its batch";
    EXPECT_EQ(seen.size(), 10u);
  }
  // A resumed run (a fresh order, any step first) and a rank taking half the rows see what the straight run saw.
  GroupedEpochOrder resumed(groups, 2, 7);
  for (int64_t step = 4; step >= 0; --step) {
    std::vector<size_t> rows = resumed.rows(step, 1, 1);
    const std::vector<size_t> first = resumed.rows(step, 0, 1);
    rows.insert(rows.begin(), first.begin(), first.end());
    EXPECT_EQ(rows, first_epoch[static_cast<size_t>(step)]) << "step " << step;
  }
  std::vector<std::vector<size_t>> second_epoch;
  for (int64_t step = 5; step < 10; ++step) second_epoch.push_back(order.rows(step, 0, 2));
  EXPECT_NE(second_epoch, first_epoch) << "each epoch its own shuffle";
}

TEST(GroupedEpochOrderTest, NoSeeableItemAnEmptyBatchAndRowsOutsideTheBatchAreRefused) {
  EXPECT_TRUE(Contains(expected_error([] { GroupedEpochOrder({-1, -1}, 2, 0); }), "no item of the set can be seen"));
  EXPECT_THROW(GroupedEpochOrder({0, 0}, 0, 0), Error);
  GroupedEpochOrder order({0, 1, 1}, 2, 0);  // fewer items in a group than a batch is fine
  EXPECT_EQ(order.steps_per_epoch(), 2);
  EXPECT_THROW(order.rows(0, 1, 2), Error);
}

}  // namespace
}  // namespace kuafu::io

// The order in which a training set's items are seen: every epoch a fresh shuffle seeded by (seed,
// epoch), cut into global batches (drop-last). Any step's rows follow from its number alone, so a run
// resumes exactly and every rank agrees without talking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kuafu::io {

class EpochOrder {
 public:
  // kuafu::Error when `items` cannot fill one `global_batch`.
  EpochOrder(int64_t items, int64_t global_batch, uint64_t seed);

  int64_t steps_per_epoch() const { return items_ / global_batch_; }
  // The items of rows [first_row, first_row + rows) of step `step`'s global batch.
  std::vector<size_t> rows(int64_t step, int64_t first_row, int64_t rows);

 private:
  int64_t items_, global_batch_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<size_t> order_;  // the current epoch's shuffle
};

// The same for items grouped (aspect-ratio buckets): every global batch holds items of one group. Each epoch
// shuffles each group's items, cuts them into global batches, the last filled up with the group's first items of
// that shuffle again (no item goes unseen however few its group has), and shuffles the batches, all from (seed,
// epoch).
class GroupedEpochOrder {
 public:
  // `group_of_item` [N]: each item's group, or -1 for an item never to be seen (unreadable). kuafu::Error when
  // no item has a group or global_batch is not positive.
  GroupedEpochOrder(std::vector<int64_t> group_of_item, int64_t global_batch, uint64_t seed);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // The group of step `step`'s global batch.
  int64_t group(int64_t step);
  // The items of rows [first_row, first_row + rows) of step `step`'s global batch.
  std::vector<size_t> rows(int64_t step, int64_t first_row, int64_t rows);

 private:
  void shuffle_epoch(int64_t epoch);

  std::vector<std::vector<size_t>> members_;  // [groups]: each group's items, ascending
  int64_t global_batch_, steps_per_epoch_ = 0;
  uint64_t seed_;
  int64_t epoch_ = -1;
  struct Batch {
    int64_t group = 0;
    std::vector<size_t> items;  // [global_batch]
  };
  std::vector<Batch> batches_;  // the current epoch's global batches, in order
};

}  // namespace kuafu::io

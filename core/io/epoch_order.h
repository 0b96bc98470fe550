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

}  // namespace kuafu::io

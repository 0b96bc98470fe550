#include "core/io/epoch_order.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "core/util/error.h"

namespace kuafu::io {

EpochOrder::EpochOrder(int64_t items, int64_t global_batch, uint64_t seed)
    : items_(items), global_batch_(global_batch), seed_(seed) {
  KUAFU_CHECK(global_batch > 0 && items >= global_batch, "a global batch of ", global_batch, " rows needs at least as many items; the set has ", items);
}

std::vector<size_t> EpochOrder::rows(int64_t step, int64_t first_row, int64_t rows) {
  KUAFU_CHECK(first_row >= 0 && rows >= 0 && first_row + rows <= global_batch_, "rows [", first_row, ", ", first_row + rows,
              ") lie outside a global batch of ", global_batch_);
  const int64_t epoch = step / steps_per_epoch();
  if (epoch != epoch_) {
    order_.resize(static_cast<size_t>(items_));
    std::iota(order_.begin(), order_.end(), size_t{0});
    std::mt19937_64 rng(seed_ * 7919ull + static_cast<uint64_t>(epoch));
    std::shuffle(order_.begin(), order_.end(), rng);
    epoch_ = epoch;
  }
  const int64_t first = (step % steps_per_epoch()) * global_batch_ + first_row;
  return {order_.begin() + first, order_.begin() + first + rows};
}

}  // namespace kuafu::io

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

GroupedEpochOrder::GroupedEpochOrder(std::vector<int64_t> group_of_item, int64_t global_batch, uint64_t seed)
    : global_batch_(global_batch), seed_(seed) {
  KUAFU_CHECK(global_batch > 0, "a global batch must hold at least one row, found ", global_batch);
  for (size_t item = 0; item < group_of_item.size(); ++item) {
    const int64_t group = group_of_item[item];
    if (group < 0) continue;
    if (static_cast<size_t>(group) >= members_.size()) members_.resize(static_cast<size_t>(group) + 1);
    members_[static_cast<size_t>(group)].push_back(item);
  }
  for (const std::vector<size_t>& members : members_) {
    steps_per_epoch_ += (static_cast<int64_t>(members.size()) + global_batch - 1) / global_batch;
  }
  KUAFU_CHECK(steps_per_epoch_ > 0, "no item of the set can be seen: each of its ", group_of_item.size(), " lies in no group");
}

void GroupedEpochOrder::shuffle_epoch(int64_t epoch) {
  std::mt19937_64 rng(seed_ * 7919ull + static_cast<uint64_t>(epoch));
  batches_.clear();
  for (size_t group = 0; group < members_.size(); ++group) {
    std::vector<size_t> order = members_[group];
    if (order.empty()) continue;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t first = 0; first < order.size(); first += static_cast<size_t>(global_batch_)) {
      Batch batch{static_cast<int64_t>(group), {}};
      for (size_t k = 0; k < static_cast<size_t>(global_batch_); ++k) batch.items.push_back(order[(first + k) % order.size()]);
      batches_.push_back(std::move(batch));
    }
  }
  std::shuffle(batches_.begin(), batches_.end(), rng);
  epoch_ = epoch;
}

int64_t GroupedEpochOrder::group(int64_t step) {
  KUAFU_CHECK(step >= 0, "step ", step, " is negative");
  if (step / steps_per_epoch_ != epoch_) shuffle_epoch(step / steps_per_epoch_);
  return batches_[static_cast<size_t>(step % steps_per_epoch_)].group;
}

std::vector<size_t> GroupedEpochOrder::rows(int64_t step, int64_t first_row, int64_t rows) {
  KUAFU_CHECK(first_row >= 0 && rows >= 0 && first_row + rows <= global_batch_, "rows [", first_row, ", ", first_row + rows,
              ") lie outside a global batch of ", global_batch_);
  group(step);  // shuffles the step's epoch
  const std::vector<size_t>& batch = batches_[static_cast<size_t>(step % steps_per_epoch_)].items;
  return {batch.begin() + first_row, batch.begin() + first_row + rows};
}

}  // namespace kuafu::io

#include "core/io/instruction_batches.h"

#include <algorithm>
#include <random>

#include "core/io/targets.h"
#include "core/util/device.h"
#include "core/util/error.h"

namespace kuafu::io {
namespace {

// The first `count` tokens of `e` as inputs, each with its next token as the target where the loss
// learns it (targets elsewhere keep kIgnoredTarget).
void write_example(const InstructionExample& e, int64_t count, int64_t* inputs, int64_t* targets) {
  const auto n = static_cast<int64_t>(e.tokens.size());
  for (int64_t i = 0; i < count; ++i) {
    inputs[i] = e.tokens[static_cast<size_t>(i)];
    if (i + 1 < n && e.learned[static_cast<size_t>(i + 1)]) targets[i] = e.tokens[static_cast<size_t>(i + 1)];
  }
}

}  // namespace

InstructionBatcher::InstructionBatcher(std::shared_ptr<const InstructionSet> examples, int64_t pad_id,
                                       int64_t global_batch, uint64_t seed, const torch::Device& device, int64_t pack_to)
    : examples_(std::move(examples)), pad_id_(pad_id), global_batch_(global_batch), seed_(seed),
      host_(host_staging_options(device).dtype(torch::kInt64)), pack_to_(pack_to) {
  KUAFU_CHECK(!examples_->examples.empty(), "the instruction set holds no examples");
  KUAFU_CHECK(global_batch_ >= 1, "the global batch must hold at least one row");
  for (const InstructionExample& e : examples_->examples) {
    KUAFU_CHECK(e.tokens.size() >= 2 && e.tokens.size() == e.learned.size(),
                "an instruction example needs at least two tokens and one learned flag per token");
    KUAFU_CHECK(pack_to_ == 0 || static_cast<int64_t>(e.tokens.size()) <= pack_to_, "an example of ", e.tokens.size(),
                " tokens does not fit a packed row of ", pack_to_);
  }
}

const std::vector<int64_t>& InstructionBatcher::epoch_order(int64_t epoch) const {
  if (epoch != epoch_) {
    const int64_t n = size();
    order_.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order_[static_cast<size_t>(i)] = i;
    std::mt19937_64 generator(seed_ * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(epoch));
    std::shuffle(order_.begin(), order_.end(), generator);
    epoch_ = epoch;
  }
  return order_;
}

int64_t InstructionBatcher::example_index(int64_t step, int64_t row) const {
  const int64_t global = step * global_batch_ + row;
  std::lock_guard<std::mutex> lock(mutex_);
  return epoch_order(global / size())[static_cast<size_t>(global % size())];
}

void InstructionBatcher::pack_epoch(int64_t epoch) const {
  if (packed_epoch_ == epoch) return;
  // Greedy: whole examples in the epoch's order while they fit, then a new row.
  packed_epoch_rows_.clear();
  int64_t used = pack_to_;
  for (int64_t index : epoch_order(epoch)) {
    const auto n = static_cast<int64_t>(examples_->examples[static_cast<size_t>(index)].tokens.size());
    if (used + n > pack_to_) {
      packed_epoch_rows_.emplace_back();
      used = 0;
    }
    packed_epoch_rows_.back().push_back(index);
    used += n;
  }
  packed_epoch_ = epoch;
  if (static_cast<int64_t>(packed_rows_before_.size()) == epoch + 1) {
    packed_rows_before_.push_back(packed_rows_before_.back() + static_cast<int64_t>(packed_epoch_rows_.size()));
  }
}

std::vector<int64_t> InstructionBatcher::packed_row(int64_t row) const {
  KUAFU_CHECK(pack_to_ > 0, "packed_row of a batcher that does not pack");
  std::lock_guard<std::mutex> lock(mutex_);
  // Epochs pack into different numbers of rows: walk them in order from the latest one packed (or the
  // first), knowing how many rows came before each.
  int64_t epoch = packed_epoch_ >= 0 && row >= packed_rows_before_[static_cast<size_t>(packed_epoch_)] ? packed_epoch_ : 0;
  while (true) {
    pack_epoch(epoch);
    const int64_t first = packed_rows_before_[static_cast<size_t>(epoch)];
    if (row < first + static_cast<int64_t>(packed_epoch_rows_.size())) {
      return packed_epoch_rows_[static_cast<size_t>(row - first)];
    }
    ++epoch;
  }
}

TokenBatch InstructionBatcher::packed_rows(const std::vector<std::vector<int64_t>>& groups) const {
  const auto rows = static_cast<int64_t>(groups.size());
  const int64_t length = pack_to_;
  torch::Tensor inputs = torch::full({rows, 2, length}, pad_id_, host_);
  inputs.select(1, 1).fill_(-1);  // padding is a document of its own
  TokenBatch batch{inputs, torch::full({rows, length}, kIgnoredTarget, host_)};
  int64_t* in = batch.inputs.data_ptr<int64_t>();
  int64_t* targets = batch.targets.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0;
    for (size_t d = 0; d < groups[static_cast<size_t>(r)].size(); ++d) {
      const InstructionExample& e = examples_->examples[static_cast<size_t>(groups[static_cast<size_t>(r)][d])];
      const auto n = static_cast<int64_t>(e.tokens.size());
      KUAFU_CHECK(at + n <= length, "examples of ", at + n, " tokens do not fit a packed row of ", length);
      // Every token goes in; the last predicts nothing, as the next one belongs to another example.
      write_example(e, n, in + (r * 2) * length + at, targets + r * length + at);
      std::fill_n(in + (r * 2 + 1) * length + at, n, static_cast<int64_t>(d));
      at += n;
    }
  }
  return batch;
}

int64_t InstructionBatcher::padded_length(int64_t longest) const {
  return (longest - 1 + 7) / 8 * 8;  // inputs drop the last token; multiples of 8 suit the kernels
}

TokenBatch InstructionBatcher::rows_of(const std::vector<int64_t>& indices, int64_t length) const {
  const auto rows = static_cast<int64_t>(indices.size());
  TokenBatch batch{torch::full({rows, length}, pad_id_, host_), torch::full({rows, length}, kIgnoredTarget, host_)};
  int64_t* inputs = batch.inputs.data_ptr<int64_t>();
  int64_t* targets = batch.targets.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const InstructionExample& e = examples_->examples[static_cast<size_t>(indices[static_cast<size_t>(r)])];
    // The last token is only a target: it has no next token to predict.
    write_example(e, static_cast<int64_t>(e.tokens.size()) - 1, inputs + r * length, targets + r * length);
  }
  return batch;
}

TokenBatch InstructionBatcher::train_batch(int64_t step, int64_t first_row, int64_t rows) const {
  KUAFU_CHECK(first_row >= 0 && first_row + rows <= global_batch_, "rows [", first_row, ", ", first_row + rows,
              ") are outside the global batch of ", global_batch_);
  if (pack_to_ > 0) {
    std::vector<std::vector<int64_t>> groups;
    for (int64_t r = first_row; r < first_row + rows; ++r) groups.push_back(packed_row(step * global_batch_ + r));
    return packed_rows(groups);
  }
  int64_t longest = 0;
  for (int64_t r = 0; r < global_batch_; ++r) {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(examples_->examples[static_cast<size_t>(example_index(step, r))].tokens.size()));
  }
  std::vector<int64_t> indices;
  for (int64_t r = first_row; r < first_row + rows; ++r) indices.push_back(example_index(step, r));
  return rows_of(indices, padded_length(longest));
}

TokenBatch InstructionBatcher::eval_batch(int64_t first, int64_t rows) const {
  KUAFU_CHECK(first >= 0 && rows >= 1 && first + rows <= size(), "evaluation rows [", first, ", ", first + rows,
              ") are outside the ", size(), " examples");
  std::vector<int64_t> indices;
  int64_t longest = 0;
  for (int64_t i = first; i < first + rows; ++i) {
    indices.push_back(i);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(examples_->examples[static_cast<size_t>(i)].tokens.size()));
  }
  return rows_of(indices, padded_length(longest));
}

}  // namespace kuafu::io

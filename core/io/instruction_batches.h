// Batches of instruction examples (core/io/instruction_data.h) for training and evaluation. A training
// step's global batch is a pure function of (seed, step), as TokenWindowLoader's is: the examples in
// a fresh shuffle per epoch, so every layout of ranks and micro-steps draws the same rows and a resumed
// run needs only the step number. The targets are the next tokens where they are learned and
// kIgnoredTarget elsewhere (prompts, padding).
//
// One example per row: rows are right-padded to the longest example of the step's global batch
// (rounded up to a multiple of 8), so every micro-batch of a step has one shape.
// Packed (`pack_to` > 0): each row of pack_to tokens holds as many whole examples as fit, in the
// epoch's order, then padding; inputs are [rows, 2, pack_to], token ids over document ids (0, 1, ...
// per example, -1 for padding), so a model can keep each example's attention and positions to itself,
// and no target crosses from one example into the next.
#pragma once

#include <memory>
#include <mutex>

#include "core/io/instruction_data.h"
#include "core/io/token_loader.h"

namespace kuafu::io {

class InstructionBatcher {
 public:
  // `global_batch`: rows per training step; `pad_id` fills the inputs past each example's end;
  // `pack_to`: tokens per packed row (0: one example per row).
  InstructionBatcher(std::shared_ptr<const InstructionSet> examples, int64_t pad_id, int64_t global_batch, uint64_t seed,
                     const torch::Device& device = torch::kCPU, int64_t pack_to = 0);

  // Rows [first_row, first_row + rows) of step `step`'s global batch.
  TokenBatch train_batch(int64_t step, int64_t first_row, int64_t rows) const;
  // Examples [first, first + rows) in file order, one per row, padded to their own longest.
  TokenBatch eval_batch(int64_t first, int64_t rows) const;
  // The examples of `indices` packed into one row per group (exposed for tests).
  TokenBatch packed_rows(const std::vector<std::vector<int64_t>>& groups) const;

  int64_t size() const { return static_cast<int64_t>(examples_->examples.size()); }
  // The example at row `row` of step `step` (unpacked; exposed for tests).
  int64_t example_index(int64_t step, int64_t row) const;
  // The examples packed into global row `row` (packed; exposed for tests).
  std::vector<int64_t> packed_row(int64_t row) const;

 private:
  TokenBatch rows_of(const std::vector<int64_t>& indices, int64_t length) const;
  int64_t padded_length(int64_t longest) const;
  const std::vector<int64_t>& epoch_order(int64_t epoch) const;  // under mutex_
  void pack_epoch(int64_t epoch) const;                          // under mutex_

  std::shared_ptr<const InstructionSet> examples_;
  int64_t pad_id_, global_batch_;
  uint64_t seed_;
  torch::TensorOptions host_;
  int64_t pack_to_;
  mutable std::mutex mutex_;  // guards the caches below
  mutable int64_t epoch_ = -1;
  mutable std::vector<int64_t> order_;
  mutable std::vector<int64_t> packed_rows_before_ = {0};       // packed: rows of the epochs before epoch e
  mutable std::vector<std::vector<int64_t>> packed_epoch_rows_;  // packed: the latest packed epoch's rows
  mutable int64_t packed_epoch_ = -1;
};

}  // namespace kuafu::io

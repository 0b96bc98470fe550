// Random training windows from a memory-mapped token file. A window is a pure function of
// (seed, step, global row), so every layout of ranks and micro-steps draws the same global batch
// and resuming needs nothing but the step number.
#pragma once

#include <memory>

#include "core/io/token_file.h"

namespace kuafu::io {

struct TokenBatch {
  torch::Tensor inputs;   // [B, T] int64
  torch::Tensor targets;  // [B, T] int64: inputs shifted by one token

  // Both on `device` (asynchronous copies through page-locked memory to a GPU).
  TokenBatch to(const torch::Device& device) const;
};

class TokenWindowLoader {
 public:
  // Batches are made in host memory that copies fast to `device` (page-locked for a GPU).
  TokenWindowLoader(std::shared_ptr<const TokenFile> file, int64_t context, uint64_t seed,
                    const torch::Device& device = torch::kCPU);

  // Rows [first_row, first_row + rows) of optimizer step `step`'s global batch.
  TokenBatch train_batch(int64_t step, int64_t first_row, int64_t rows) const;

  // Evaluation windows: `total` evenly spaced windows covering the file; rows [first, first+rows).
  TokenBatch eval_batch(int64_t total, int64_t first_row, int64_t rows) const;

  // Start offset of a training window (exposed for tests).
  uint64_t train_offset(int64_t step, int64_t row) const;

  int64_t context() const { return context_; }
  const TokenFile& file() const { return *file_; }

 private:
  TokenBatch windows(const std::vector<uint64_t>& offsets) const;

  std::shared_ptr<const TokenFile> file_;
  int64_t context_;
  uint64_t seed_;
  torch::TensorOptions host_;
};

}  // namespace kuafu::io

#include "core/util/device.h"
#include "core/io/token_loader.h"

#include "core/util/error.h"

namespace kuafu::io {
namespace {

// splitmix64: a counter-based generator, so draws need no stored state.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

TokenWindowLoader::TokenWindowLoader(std::shared_ptr<const TokenFile> file, int64_t context, uint64_t seed,
                                     const torch::Device& device)
    : file_(std::move(file)), context_(context), seed_(seed), host_(host_staging_options(device).dtype(torch::kInt64)) {
  KUAFU_CHECK(context_ >= 1, "context length must be >= 1, found ", context_);
  KUAFU_CHECK(file_->size() > static_cast<uint64_t>(context_) + 1, "token file holds ", file_->size(),
              " tokens, too few for windows of ", context_, " + 1 tokens");
}

TokenBatch TokenBatch::to(const torch::Device& device) const {
  return {to_device(inputs, device), to_device(targets, device)};
}

uint64_t TokenWindowLoader::train_offset(int64_t step, int64_t row) const {
  const uint64_t positions = file_->size() - static_cast<uint64_t>(context_);  // valid starts
  const uint64_t h = mix(mix(mix(seed_) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(row));
  return h % positions;
}

TokenBatch TokenWindowLoader::windows(const std::vector<uint64_t>& offsets) const {
  const int64_t rows = static_cast<int64_t>(offsets.size());
  // Inputs and targets (the same window one token on) are written straight into their own buffers.
  TokenBatch batch{torch::empty({rows, context_}, host_), torch::empty({rows, context_}, host_)};
  int64_t* inputs = batch.inputs.data_ptr<int64_t>();
  int64_t* targets = batch.targets.data_ptr<int64_t>();
  const auto length = static_cast<uint64_t>(context_);
  for (int64_t r = 0; r < rows; ++r) {
    file_->copy_window(offsets[r], length, inputs + r * context_);
    file_->copy_window(offsets[r] + 1, length, targets + r * context_);
  }
  return batch;
}

TokenBatch TokenWindowLoader::train_batch(int64_t step, int64_t first_row, int64_t rows) const {
  std::vector<uint64_t> offsets(rows);
  for (int64_t r = 0; r < rows; ++r) offsets[r] = train_offset(step, first_row + r);
  return windows(offsets);
}

TokenBatch TokenWindowLoader::eval_batch(int64_t total, int64_t first_row, int64_t rows) const {
  KUAFU_CHECK(total >= 1 && first_row + rows <= total, "eval rows out of range");
  const uint64_t last_start = file_->size() - static_cast<uint64_t>(context_) - 1;
  std::vector<uint64_t> offsets(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t k = static_cast<uint64_t>(first_row + r);
    offsets[r] = total == 1 ? 0 : last_start * k / static_cast<uint64_t>(total - 1);
  }
  return windows(offsets);
}

}  // namespace kuafu::io

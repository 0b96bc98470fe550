#include "core/memory/chunk_layout.h"

#include <algorithm>

#include "core/util/error.h"

namespace kuafu::memory {

ChunkLayout::ChunkLayout(const std::vector<int64_t>& numels, int64_t chunk_numel, int shards) : shards_(shards) {
  KUAFU_CHECK(shards >= 1, "chunk layout: shards must be at least 1, got ", shards);
  KUAFU_CHECK(chunk_numel >= 1, "chunk layout: chunk size must be at least 1 element, got ", chunk_numel);
  int64_t used = chunk_numel;  // no open chunk yet
  for (int64_t i = 0; i < static_cast<int64_t>(numels.size()); ++i) {
    const int64_t n = numels[i];
    KUAFU_CHECK(n >= 0, "chunk layout: tensor ", i, " has a negative size");
    if (chunk_numels_.empty() || used + n > chunk_numels_.back()) {
      chunk_numels_.push_back(std::max(chunk_numel, n));
      members_.emplace_back();
      used = 0;
    }
    slots_.push_back({num_chunks() - 1, used, n});
    members_.back().push_back(i);
    used += n;
    tensor_numel_ += n;
  }
  // Trailing space of the last chunk is not needed: trim it, then pad every chunk to whole shards.
  if (!chunk_numels_.empty()) chunk_numels_.back() = std::max<int64_t>(used, 1);
  for (auto& size : chunk_numels_) size = (size + shards - 1) / shards * shards;
}

Piece ChunkLayout::piece(int64_t tensor, int shard) const {
  const TensorSlot& s = slot(tensor);
  const int64_t shard_begin = shard * shard_numel(s.chunk);
  const int64_t begin = std::max(s.offset, shard_begin);
  const int64_t end = std::min(s.offset + s.numel, shard_begin + shard_numel(s.chunk));
  if (begin >= end) return {0, 0, 0};
  return {begin - s.offset, begin - shard_begin, end - begin};
}

int64_t ChunkLayout::total_numel() const {
  int64_t total = 0;
  for (int64_t size : chunk_numels_) total += size;
  return total;
}

int64_t ChunkLayout::wasted_numel() const { return total_numel() - tensor_numel_; }

int64_t ChunkLayout::largest_chunk_numel() const {
  return chunk_numels_.empty() ? 0 : *std::max_element(chunk_numels_.begin(), chunk_numels_.end());
}

int64_t search_chunk_numel(const std::vector<int64_t>& numels, int64_t min_numel, int64_t max_numel, int64_t step,
                           int shards) {
  KUAFU_CHECK(step >= 1, "chunk size search: step must be at least 1 element");
  // A tensor above max_numel takes a chunk of its own (as Colossal-AI leaves its extra-large parameters out
  // of its search): one embedding would otherwise set every chunk's size, and with it the disk tier's buffers.
  int64_t largest = 1, largest_fitting = 0;
  for (int64_t n : numels) {
    largest = std::max(largest, n);
    if (n <= max_numel) largest_fitting = std::max(largest_fitting, n);
  }
  if (largest_fitting == 0) return std::max(min_numel, largest);  // every tensor in a chunk of its own
  const int64_t first = std::max({min_numel, largest_fitting, int64_t{1}});
  if (first >= max_numel) return first;
  int64_t best = first, best_waste = -1;
  for (int64_t size = first; size <= max_numel; size += step) {
    const int64_t waste = ChunkLayout(numels, size, shards).wasted_numel();
    if (best_waste < 0 || waste < best_waste) {
      best = size;
      best_waste = waste;
    }
  }
  return best;
}

}  // namespace kuafu::memory

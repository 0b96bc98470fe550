// Chunks: tensors packed in a given order into flat chunks of a fixed size (a tensor is never split
// across two), each chunk cut into equal shards over the ranks of a data-parallel group. The
// bookkeeping that ZeRO (chunks as communication buckets) and Gemini (chunks as the unit of placement)
// share; it holds sizes only, no tensors.
#pragma once

#include <cstdint>
#include <vector>

namespace kuafu::memory {

// Where one tensor lives: elements [offset, offset + numel) of chunk `chunk`.
struct TensorSlot {
  int64_t chunk = 0;
  int64_t offset = 0;
  int64_t numel = 0;
};

// The part of a tensor that falls in one shard of its chunk (numel 0 when none does).
struct Piece {
  int64_t tensor_offset = 0;  // first element, counted in the tensor's flat elements
  int64_t shard_offset = 0;   // where that element sits inside the shard
  int64_t numel = 0;
};

class ChunkLayout {
 public:
  // Packs tensors of `numels` elements, in order, into chunks of `chunk_numel` elements: a tensor that
  // does not fit in the current chunk starts the next one, and one larger than `chunk_numel` gets a
  // chunk of its own size. Every chunk is then padded to a multiple of `shards`.
  ChunkLayout(const std::vector<int64_t>& numels, int64_t chunk_numel, int shards);

  int shards() const { return shards_; }
  int64_t num_chunks() const { return static_cast<int64_t>(chunk_numels_.size()); }
  int64_t num_tensors() const { return static_cast<int64_t>(slots_.size()); }
  int64_t chunk_numel(int64_t chunk) const { return chunk_numels_.at(chunk); }
  int64_t shard_numel(int64_t chunk) const { return chunk_numels_.at(chunk) / shards_; }
  const TensorSlot& slot(int64_t tensor) const { return slots_.at(tensor); }
  const std::vector<int64_t>& tensors_in(int64_t chunk) const { return members_.at(chunk); }
  // The part of `tensor` inside shard `shard` of its chunk.
  Piece piece(int64_t tensor, int shard) const;

  int64_t total_numel() const;   // all chunks, padding included
  int64_t wasted_numel() const;  // chunk space no tensor uses
  int64_t largest_chunk_numel() const;

 private:
  int shards_;
  std::vector<TensorSlot> slots_;
  std::vector<int64_t> chunk_numels_;
  std::vector<std::vector<int64_t>> members_;  // [chunk] -> tensor indices, in order
  int64_t tensor_numel_ = 0;
};

// Gemini's chunk-size search: the chunk size in [max(min_numel, largest tensor up to max_numel), max_numel],
// tried in steps of `step` elements, whose layout wastes the fewest elements (ties go to the smaller size,
// which keeps the unit of placement fine). A tensor larger than max_numel gets a chunk of its own; when
// every tensor is, the result is the largest tensor's size.
int64_t search_chunk_numel(const std::vector<int64_t>& numels, int64_t min_numel, int64_t max_numel, int64_t step,
                           int shards);

}  // namespace kuafu::memory

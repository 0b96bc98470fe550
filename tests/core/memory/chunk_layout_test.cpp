// Chunk layout: packing in order without splitting a tensor, padding to whole shards, the pieces each
// shard holds (worked by hand, and covering every element exactly once), and the chunk-size search.
#include <gtest/gtest.h>

#include <random>

#include "core/memory/chunk_layout.h"
#include "core/util/error.h"

namespace kuafu::memory {
namespace {

// Sizes 5, 3, 4, 10 in chunks of 8 over 2 shards: [5 3] [4 . . . .] [10] (the last chunk trimmed).
TEST(ChunkLayoutTest, PacksInOrderWithoutSplittingATensor) {
  const ChunkLayout layout({5, 3, 4, 10}, 8, 2);
  ASSERT_EQ(layout.num_chunks(), 3);
  EXPECT_EQ(layout.chunk_numel(0), 8);
  EXPECT_EQ(layout.chunk_numel(1), 8);
  EXPECT_EQ(layout.chunk_numel(2), 10);
  EXPECT_EQ(layout.slot(1).chunk, 0);
  EXPECT_EQ(layout.slot(1).offset, 5);
  EXPECT_EQ(layout.slot(2).chunk, 1);
  EXPECT_EQ(layout.slot(3).chunk, 2);
  EXPECT_EQ(layout.tensors_in(0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(layout.total_numel(), 26);
  EXPECT_EQ(layout.wasted_numel(), 4);
  EXPECT_EQ(layout.largest_chunk_numel(), 10);
}

TEST(ChunkLayoutTest, ChunksArePaddedToWholeShards) {
  const ChunkLayout layout({7}, 100, 4);  // the only chunk is trimmed to 7, then padded to 8
  EXPECT_EQ(layout.chunk_numel(0), 8);
  EXPECT_EQ(layout.shard_numel(0), 2);
  EXPECT_EQ(layout.wasted_numel(), 1);
}

// Chunk 0 = [t0: 5 elements][t1: 3 elements], shards of 4: shard 0 holds t0[0:4], shard 1 holds t0[4]
// at its start and t1[0:3] after it.
TEST(ChunkLayoutTest, PiecesWorkedByHand) {
  const ChunkLayout layout({5, 3}, 8, 2);
  const Piece a = layout.piece(0, 0);
  EXPECT_EQ(a.tensor_offset, 0);
  EXPECT_EQ(a.shard_offset, 0);
  EXPECT_EQ(a.numel, 4);
  const Piece b = layout.piece(0, 1);
  EXPECT_EQ(b.tensor_offset, 4);
  EXPECT_EQ(b.shard_offset, 0);
  EXPECT_EQ(b.numel, 1);
  EXPECT_EQ(layout.piece(1, 0).numel, 0);
  const Piece c = layout.piece(1, 1);
  EXPECT_EQ(c.tensor_offset, 0);
  EXPECT_EQ(c.shard_offset, 1);
  EXPECT_EQ(c.numel, 3);
}

// Random sizes, chunk sizes and shard counts: every element of every tensor lies in exactly one
// shard's piece, at the position the slot implies.
TEST(ChunkLayoutTest, PiecesCoverEveryElementOnce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> numels(1 + rng() % 12);
    for (auto& n : numels) n = rng() % 40;
    const int shards = 1 + static_cast<int>(rng() % 5);
    const ChunkLayout layout(numels, 1 + rng() % 60, shards);
    for (int64_t t = 0; t < layout.num_tensors(); ++t) {
      std::vector<int> seen(numels[t], 0);
      for (int s = 0; s < shards; ++s) {
        const Piece piece = layout.piece(t, s);
        for (int64_t k = 0; k < piece.numel; ++k) {
          ++seen[piece.tensor_offset + k];
          // Position in the chunk computed two ways.
          EXPECT_EQ(s * layout.shard_numel(layout.slot(t).chunk) + piece.shard_offset + k,
                    layout.slot(t).offset + piece.tensor_offset + k);
        }
      }
      for (int count : seen) ASSERT_EQ(count, 1) << "trial " << trial << " tensor " << t;
    }
    EXPECT_EQ(layout.total_numel() % shards, 0);
  }
}

// Sizes 6, 2, 6, 2, 6, 2: a chunk of 8 holds each pair exactly (no waste); 6 and 7 waste space, and 16
// wastes nothing either but is larger.
TEST(ChunkLayoutTest, SearchFindsTheLeastWastefulChunkSize) {
  const std::vector<int64_t> sizes = {6, 2, 6, 2, 6, 2};
  EXPECT_EQ(search_chunk_numel(sizes, 0, 20, 1, 1), 8);
  EXPECT_EQ(ChunkLayout(sizes, 8, 1).wasted_numel(), 0);
  EXPECT_GT(ChunkLayout(sizes, 7, 1).wasted_numel(), 0);
  // Never below the largest tensor that fits the range (smaller sizes would waste nothing either).
  EXPECT_EQ(search_chunk_numel({7, 1}, 0, 20, 1, 1), 7);
}

// A tensor above the range takes a chunk of its own and leaves the size to the others: with 50 among
// 6, 2, 6, 2 and at most 20, chunks of 8 hold each pair (6 wastes 4, 7 wastes 7), where a search from the
// largest tensor would make every chunk 50. When no tensor fits, each is a chunk of its own size.
TEST(ChunkLayoutTest, ATensorAboveTheSearchTakesAChunkOfItsOwn) {
  const std::vector<int64_t> sizes = {6, 2, 50, 6, 2};
  EXPECT_EQ(search_chunk_numel(sizes, 0, 20, 1, 1), 8);
  const ChunkLayout layout(sizes, 8, 1);
  ASSERT_EQ(layout.num_chunks(), 3);
  EXPECT_EQ(layout.tensors_in(1), (std::vector<int64_t>{2}));
  EXPECT_EQ(layout.chunk_numel(0), 8);
  EXPECT_EQ(layout.chunk_numel(1), 50);
  EXPECT_EQ(layout.wasted_numel(), 0);
  EXPECT_EQ(ChunkLayout(sizes, 6, 1).wasted_numel(), 4);
  EXPECT_EQ(ChunkLayout(sizes, 7, 1).wasted_numel(), 7);
  EXPECT_EQ(search_chunk_numel({50, 30}, 0, 20, 1, 1), 50);
}

TEST(ChunkLayoutTest, BadArgumentsAreErrors) {
  EXPECT_THROW(ChunkLayout({1}, 8, 0), Error);
  EXPECT_THROW(ChunkLayout({1}, 0, 1), Error);
  EXPECT_THROW(search_chunk_numel({1}, 0, 8, 0, 1), Error);
}

}  // namespace
}  // namespace kuafu::memory

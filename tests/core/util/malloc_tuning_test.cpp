// What the disk tier's malloc setting does, read from glibc's own counters (mallinfo2: hblkhd is the bytes
// of blocks served by their own mappings).
#include "core/util/malloc_tuning.h"

#include <malloc.h>

#include <cstdlib>

#include <gtest/gtest.h>

namespace kuafu {
namespace {

// Bytes of blocks that malloc mapped for themselves, after allocating `bytes` and while it is held.
size_t mapped_while_holding(size_t bytes) {
  void* volatile block = std::malloc(bytes);  // volatile: the allocation is not optimised away
  static_cast<volatile char*>(block)[0] = 1;
  const size_t mapped = mallinfo2().hblkhd;
  std::free(block);
  return mapped;
}

// Two MiB more than the heap's top can serve: glibc maps a block only when the heap would have to grow for it.
size_t beyond_the_heap_top() { return mallinfo2().keepcost + (size_t{2} << 20); }

// A chunk's temporaries in the disk tier's streamed step are a few MiB; from the heap they leave holes that
// stay resident (a 24-layer GPT: 7,046 MiB resident for 3,968 allocated), so they get their own mappings,
// unmapped when freed. The training default keeps them on the heap, for speed.
TEST(MallocTuningTest, UnderTheDiskTierABlockOfAFewMiBIsMappedAndGivenBackWhenFreed) {
  keep_freed_memory_for_reuse();
  const size_t before_heap = mallinfo2().hblkhd;
  EXPECT_EQ(mapped_while_holding(beyond_the_heap_top()), before_heap) << "the training default grows the heap";

  return_large_freed_blocks_to_the_system();
  const size_t bytes = beyond_the_heap_top();
  ASSERT_LT(bytes, size_t{16} << 20) << "the heap's top is too large for this test to tell 1 MiB from 32 MiB";
  const size_t before = mallinfo2().hblkhd;
  EXPECT_GE(mapped_while_holding(bytes), before + bytes);
  EXPECT_EQ(mallinfo2().hblkhd, before) << "the mapping goes back to the system when the block is freed";
  EXPECT_EQ(mapped_while_holding(size_t{256} << 10), before) << "small blocks still come from the heap";
}

}  // namespace
}  // namespace kuafu

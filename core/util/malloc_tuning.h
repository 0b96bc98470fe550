// glibc malloc settings for training loops. By default glibc serves every block above its (adaptive)
// mmap threshold with a fresh mmap and trims freed heap tops, so each step's activations cost page
// faults and zeroing by the kernel: about half of a step was system time. Measured on the small ViT
// (batch 8192 = 16 x 512, 2 threads): 1,400 -> 2,650 images/s (README "Performance").
#pragma once

namespace kuafu {

// Serves every block from the heap (no per-block mmap) and keeps up to 1 GiB of freed heap in the
// process for reuse. Call first thing in main, before large allocations.
void keep_freed_memory_for_reuse();

// Serves blocks of 1 MiB and more (chunks, their gradients and optimizer state, the streamed step's per-chunk
// temporaries) with their own mappings again, given back to the system when freed, for a process whose limit
// is memory rather than speed (the disk tier). Reused from the heap, the freed ones left holes there that
// stayed resident: a GPT of 24 layers x 28.3M parameters with its masters on the disk allocated at most
// 3,968 MiB and peaked at 7,046 MiB resident with blocks from 32 MiB mapped, 4,210 MiB with blocks from 1 MiB
// (docs/memory.md).
void return_large_freed_blocks_to_the_system();

}  // namespace kuafu

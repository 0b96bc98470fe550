// glibc malloc settings for training loops. By default glibc serves every block above its (adaptive)
// mmap threshold with a fresh mmap and trims freed heap tops, so each step's activations cost page
// faults and zeroing by the kernel: about half of a step was system time. Measured on the small ViT
// (batch 8192 = 16 x 512, 2 threads): 1,400 -> 2,650 images/s (README "Performance").
#pragma once

namespace kuafu {

// Serves every block from the heap (no per-block mmap) and keeps up to 1 GiB of freed heap in the
// process for reuse. Call first thing in main, before large allocations.
void keep_freed_memory_for_reuse();

}  // namespace kuafu

// What a device's allocator holds: the measurements behind Gemini's non-model memory trace and the
// memory figures of logs and benchmarks. On CUDA they come from LibTorch's caching allocator; on the
// CPU from glibc's heap statistics (every arena, mmapped blocks included) and the process's resident set.
#pragma once

#include <cstdint>

#include <torch/types.h>

namespace kuafu::memory {

// Bytes allocated and not yet freed on `device` now.
int64_t bytes_in_use(const torch::Device& device);
// The most bytes `device` has held: the CUDA allocator's peak, or the process's peak resident set on the CPU.
int64_t peak_bytes(const torch::Device& device);
// The process's resident set now (host memory, whatever holds it).
int64_t resident_bytes();

}  // namespace kuafu::memory

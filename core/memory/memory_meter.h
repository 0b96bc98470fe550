// What a device's allocator holds: the measurements behind Gemini's non-model memory trace and the
// memory figures of logs and benchmarks. On CUDA they come from LibTorch's caching allocator; on the
// CPU from glibc's heap statistics (every arena, mmapped blocks included) and the process's resident set.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#include <torch/types.h>

namespace kuafu::memory {

// Bytes allocated and not yet freed on `device` now.
int64_t bytes_in_use(const torch::Device& device);
// Host memory mapped outside malloc (the disk tier's chunk homes), which bytes_in_use on the CPU counts too.
void count_mapped_bytes(int64_t delta);
// The most bytes `device` has held: the CUDA allocator's peak, or the process's peak resident set on the CPU.
int64_t peak_bytes(const torch::Device& device);
// The process's resident set now (host memory, whatever holds it).
int64_t resident_bytes();
// What a run can still allocate: the host's available memory (MemAvailable), or a GPU's free memory.
int64_t available_bytes(const torch::Device& device);

// The most bytes in use on `device` while it lives (or since restart()): what a model really needs,
// without what the allocator keeps for reuse (the same measure as CUDA's allocated-bytes peak, which it
// reads there). The CPU has no such counter, so a background thread samples bytes_in_use every
// `interval`: an allocation that lives shorter than that may be missed.
class PeakInUse {
 public:
  explicit PeakInUse(const torch::Device& device, std::chrono::microseconds interval = std::chrono::milliseconds(2));
  ~PeakInUse();
  PeakInUse(const PeakInUse&) = delete;
  PeakInUse& operator=(const PeakInUse&) = delete;
  int64_t peak() const;
  // Forgets the peak so far: peak() then covers from now on. On CUDA this resets the allocator's peak,
  // which every reader of peak_bytes shares.
  void restart();

 private:
  void sample();

  torch::Device device_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;  // a sample taken before restart() must not land after it
  int64_t peak_ = 0;
  std::thread sampler_;
};

}  // namespace kuafu::memory

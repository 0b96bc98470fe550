#include "core/memory/memory_meter.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

#ifdef KUAFU_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace kuafu::memory {

int64_t bytes_in_use(const torch::Device& device) {
#ifdef KUAFU_WITH_CUDA
  if (device.is_cuda()) {
    return static_cast<int64_t>(
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current);
  }
#endif
  (void)device;
  const struct mallinfo2 heap = mallinfo2();
  return static_cast<int64_t>(heap.uordblks + heap.hblkhd);  // chunks in use + mmapped blocks
}

int64_t peak_bytes(const torch::Device& device) {
#ifdef KUAFU_WITH_CUDA
  if (device.is_cuda()) {
    return static_cast<int64_t>(
        c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak);
  }
#endif
  (void)device;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

PeakInUse::PeakInUse(const torch::Device& device, std::chrono::microseconds interval) : device_(device) {
  if (device.is_cuda()) return;
  peak_ = bytes_in_use(device);
  sampler_ = std::thread([this, interval] {
    while (!stop_) {
      const int64_t now = bytes_in_use(device_);
      if (now > peak_) peak_ = now;
      std::this_thread::sleep_for(interval);
    }
  });
}

PeakInUse::~PeakInUse() {
  stop_ = true;
  if (sampler_.joinable()) sampler_.join();
}

int64_t PeakInUse::peak() const { return device_.is_cuda() ? peak_bytes(device_) : peak_.load(); }

}  // namespace kuafu::memory

#include "core/memory/memory_meter.h"

#include <atomic>

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#ifdef KUAFU_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace kuafu::memory {

#ifdef KUAFU_WITH_CUDA
namespace {
// The caching allocator's statistics exist once LibTorch has initialised CUDA, which it does lazily at the
// first CUDA tensor or seed; a meter read before that ("Invalid device argument") initialises it first.
c10::CachingDeviceAllocator::DeviceStats cuda_stats(const torch::Device& device) {
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
}
}  // namespace
#endif

namespace {
std::atomic<int64_t> mapped_bytes{0};  // count_mapped_bytes
}  // namespace

int64_t bytes_in_use(const torch::Device& device) {
#ifdef KUAFU_WITH_CUDA
  if (device.is_cuda()) {
    return static_cast<int64_t>(cuda_stats(device).allocated_bytes[0].current);
  }
#endif
  (void)device;
  const struct mallinfo2 heap = mallinfo2();
  return static_cast<int64_t>(heap.uordblks + heap.hblkhd) + mapped_bytes.load();  // chunks in use + mmapped blocks
}

void count_mapped_bytes(int64_t delta) { mapped_bytes += delta; }

int64_t peak_bytes(const torch::Device& device) {
#ifdef KUAFU_WITH_CUDA
  if (device.is_cuda()) {
    return static_cast<int64_t>(cuda_stats(device).allocated_bytes[0].peak);
  }
#endif
  (void)device;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t available_bytes(const torch::Device& device) {
#ifdef KUAFU_WITH_CUDA
  if (device.is_cuda()) {
    size_t free = 0, total = 0;
    const c10::cuda::CUDAGuard on(device.index());
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }
#else
  (void)device;
#endif
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kib = 0;
    meminfo >> kib;
    if (key == "MemAvailable:") return kib * 1024;
    meminfo.ignore(256, '\n');
  }
  return static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
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
      sample();
      std::this_thread::sleep_for(interval);
    }
  });
}

PeakInUse::~PeakInUse() {
  stop_ = true;
  if (sampler_.joinable()) sampler_.join();
}

void PeakInUse::sample() {
  const std::lock_guard<std::mutex> lock(mutex_);
  peak_ = std::max(peak_, bytes_in_use(device_));
}

int64_t PeakInUse::peak() const {
  if (device_.is_cuda()) return peak_bytes(device_);
  const std::lock_guard<std::mutex> lock(mutex_);
  return std::max(peak_, bytes_in_use(device_));  // now counts too, however short the window
}

void PeakInUse::restart() {
#ifdef KUAFU_WITH_CUDA
  if (device_.is_cuda()) {
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
    return;
  }
#endif
  const std::lock_guard<std::mutex> lock(mutex_);
  peak_ = bytes_in_use(device_);
}

}  // namespace kuafu::memory

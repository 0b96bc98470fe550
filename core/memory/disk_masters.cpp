#include "core/memory/disk_masters.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/memory/memory_meter.h"
#include "core/memory/storage_memory.h"
#include "core/util/error.h"

namespace kuafu::memory {
namespace {

int64_t bytes_of(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Whole pages from mmap, unmapped when the data pointer goes (its context holds where and how long).
struct Mapping {
  void* start;
  size_t bytes;
};

void unmap_mapping(void* context) {
  auto* mapping = static_cast<Mapping*>(context);
  ::munmap(mapping->start, mapping->bytes);
  count_mapped_bytes(-static_cast<int64_t>(mapping->bytes));
  delete mapping;
}

class PageAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    if (bytes == 0) return {nullptr, nullptr, &no_op, c10::Device(c10::kCPU)};
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    KUAFU_CHECK(p != MAP_FAILED, "disk tier: cannot map ", bytes, " bytes of host memory for a chunk");
    count_mapped_bytes(static_cast<int64_t>(bytes));
    return {p, new Mapping{p, bytes}, &unmap_mapping, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  static void no_op(void*) {}
};

// Runs `wait` and adds the seconds it took to `total`.
template <typename Wait>
void timed(double& total, const Wait& wait) {
  const auto start = std::chrono::steady_clock::now();
  wait();
  total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

torch::Tensor mapped_host_tensor(int64_t numel) {
  static PageAllocator allocator;
  const size_t bytes = static_cast<size_t>(numel) * sizeof(float);
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, &allocator, /*resizable=*/true);
  return torch::empty({0}, torch::kFloat32).set_(storage, 0, {numel}, {1});
}

DiskMasters::DiskMasters(DiskTierOptions options) : disk_(std::move(options)) {}

DiskMasters::~DiskMasters() {
  try {
    settle();
  } catch (...) {  // the scratch files go with the tier; an error already stopped the run
  }
}

void DiskMasters::adopt(int64_t c, const torch::Tensor& record, const torch::Tensor& grad) {
  KUAFU_CHECK(!holds(c), "chunk ", c, " is on the disk tier already");
  KUAFU_CHECK(record.is_contiguous() && grad.is_contiguous() && record.device().is_cpu() && grad.device().is_cpu(),
              "the disk tier takes contiguous host tensors");
  Chunk& chunk = homes_[c];
  chunk.record = {2 * c, record, Where::kHere, false, {}};
  chunk.grad = {2 * c + 1, grad, Where::kHere, false, {}};
  host_bytes_ += bytes_of(record) + bytes_of(grad);
  peak_host_bytes_ = std::max(peak_host_bytes_, host_bytes_);
  give_memory(chunk.grad);  // zeros, which need no file
  write_behind(chunk.record);
}

void DiskMasters::take_back(int64_t c) {
  KUAFU_CHECK(holds(c), "chunk ", c, " is not on the disk tier");
  Chunk& chunk = homes_.at(c);
  for (Home* home : {&chunk.record, &chunk.grad}) {
    wait_here(*home);  // a home being written is used as it is, once its write is done
    host_bytes_ -= bytes_of(home->tensor);  // no longer the tier's: its memory stays with its owner
    if (home->has_file) disk_.drop(home->key);
  }
  homes_.erase(c);
}

void DiskMasters::take_memory(Home& home) {
  allocate_storage(home.tensor);
  host_bytes_ += bytes_of(home.tensor);
  peak_host_bytes_ = std::max(peak_host_bytes_, host_bytes_);
}

void DiskMasters::give_memory(Home& home) {
  free_storage(home.tensor);
  host_bytes_ -= bytes_of(home.tensor);
  home.where = Where::kAway;
}

void DiskMasters::fetch(Home& home) {
  if (home.where == Where::kHere || home.where == Where::kReading) return;
  if (home.where == Where::kWriting) {  // still in memory: used as it is
    finish_write(home);
    return;
  }
  take_memory(home);
  if (home.has_file) {
    home.transfer = disk_.read(home.key, home.tensor.data_ptr(), bytes_of(home.tensor));
    home.where = Where::kReading;
  } else {
    home.tensor.zero_();
    home.where = Where::kHere;
  }
}

void DiskMasters::wait_here(Home& home) {
  fetch(home);
  if (home.where != Where::kReading) return;
  timed(wait_seconds_, [&] { home.transfer.wait(); });
  home.transfer = {};
  home.where = Where::kHere;
}

void DiskMasters::send(Home& home) {
  KUAFU_CHECK(home.where == Where::kHere, "disk tier: a chunk's home is written while not in memory");
  home.transfer = disk_.write(home.key, home.tensor.data_ptr(), bytes_of(home.tensor));
  home.has_file = true;
  home.where = Where::kWriting;
  behind_.push_back(&home);
}

void DiskMasters::write_behind(Home& home) {
  send(home);
  retire_writes(kBehind);
}

void DiskMasters::finish_write(Home& home) {
  if (home.where != Where::kWriting) return;
  timed(wait_seconds_, [&] { home.transfer.wait(); });
  home.transfer = {};
  home.where = Where::kHere;
  behind_.erase(std::find(behind_.begin(), behind_.end(), &home));
}

void DiskMasters::let_go(Home& home) {
  if (home.where == Where::kAway) return;
  if (home.where == Where::kReading) wait_here(home);  // its read writes into the memory
  finish_write(home);
  give_memory(home);
}

void DiskMasters::retire_writes(size_t keep) {
  while (behind_.size() > keep) {
    Home& oldest = *behind_.front();
    finish_write(oldest);
    give_memory(oldest);
  }
}

void DiskMasters::settle() { retire_writes(0); }

void DiskMasters::bring_gradient(int64_t c) { wait_here(homes_.at(c).grad); }

void DiskMasters::send_gradient(int64_t c) { write_behind(homes_.at(c).grad); }

void DiskMasters::forget_gradients() {
  for (auto& [c, chunk] : homes_) {
    let_go(chunk.grad);
    if (chunk.grad.has_file) disk_.drop(chunk.grad.key);
    chunk.grad.has_file = false;
  }
}

void DiskMasters::for_each(bool gradients, bool changed, const std::function<void(int64_t c)>& body) {
  std::vector<int64_t> order;
  for (const auto& item : homes_) order.push_back(item.first);
  const auto start = [&](size_t k) {
    if (k >= order.size()) return;
    Chunk& chunk = homes_.at(order[k]);
    fetch(chunk.record);
    if (gradients) fetch(chunk.grad);
  };
  for (size_t k = 0; k < std::min<size_t>(kAhead, order.size()); ++k) start(k);
  for (size_t k = 0; k < order.size(); ++k) {
    start(k + kAhead);
    Chunk& chunk = homes_.at(order[k]);
    wait_here(chunk.record);
    if (gradients) wait_here(chunk.grad);
    body(order[k]);
    if (gradients) let_go(chunk.grad);
    close(order[k], changed);
  }
}

void DiskMasters::open(int64_t c) { wait_here(homes_.at(c).record); }

void DiskMasters::close(int64_t c, bool changed) {
  Home& record = homes_.at(c).record;
  if (changed) {
    write_behind(record);
  } else {
    let_go(record);
  }
}

}  // namespace kuafu::memory

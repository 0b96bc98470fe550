#include "core/memory/disk_masters.h"

#include <algorithm>
#include <chrono>

#include "core/memory/storage_memory.h"
#include "core/util/error.h"

namespace kuafu::memory {
namespace {

int64_t bytes_of(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Runs `wait` and adds the seconds it took to `total`.
template <typename Wait>
void timed(double& total, const Wait& wait) {
  const auto start = std::chrono::steady_clock::now();
  wait();
  total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

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
  send(chunk.record);
  retire_writes(kBehind);
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

void DiskMasters::send_gradient(int64_t c) {
  send(homes_.at(c).grad);
  retire_writes(kBehind);
}

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
    if (changed) {
      send(chunk.record);
      retire_writes(kBehind);
    } else {
      let_go(chunk.record);
    }
  }
}

void DiskMasters::open(int64_t c) { wait_here(homes_.at(c).record); }

void DiskMasters::close(int64_t c, bool changed) {
  Home& record = homes_.at(c).record;
  if (changed) {
    send(record);
    retire_writes(kBehind);
  } else {
    let_go(record);
  }
}

}  // namespace kuafu::memory

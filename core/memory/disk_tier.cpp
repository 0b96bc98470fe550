#include "core/memory/disk_tier.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/memory/tier_ledger.h"
#include "core/util/error.h"
#include "core/util/malloc_tuning.h"

namespace kuafu::memory {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kAlign = 4096;               // O_DIRECT's alignment of memory, offsets and lengths
constexpr int64_t kBounceBytes = int64_t{8} << 20;  // one I/O call's most bytes (a multiple of kAlign)

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % kAlign == 0 && bytes % kAlign == 0;
}
int64_t padded(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The scratch folders of runs that died (their lock file free) inside `dir`.
// Whether the process that named a scratch folder "<prefix><pid>-<n>" is alive on this machine (the folders
// are node-local). A name without a process id counts as alive: left alone.
bool maker_alive(const std::string& name) {
  const std::string digits = name.substr(std::strlen(DiskTier::kScratchPrefix), name.find('-', std::strlen(DiskTier::kScratchPrefix)) -
                                                                                    std::strlen(DiskTier::kScratchPrefix));
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return true;
  const auto pid = static_cast<pid_t>(std::stol(digits));
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

void remove_dead_runs_folders(const std::string& dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(DiskTier::kScratchPrefix, 0) != 0 || !entry.is_directory()) continue;
    // A live run's folder is left alone, whatever its lock says: a starting run makes its folder, then its lock
    // file, then takes the lock, and probing the lock in between (which takes it for a moment) would both
    // remove its folder and make its own lock fail. Two ranks of one job starting together did exactly that.
    if (maker_alive(name)) continue;
    const std::string folder = entry.path().string();
    if (!fs::exists(FolderLock::lock_file(folder)) || FolderLock::held(folder)) continue;
    fs::remove_all(entry.path(), error);
  }
}

// Every byte of [data, data + bytes) to or from `fd` at `offset`, through partial transfers and signals;
// the errno of a failure, ENODATA for a read that ends early, 0 when done.
int write_all(int fd, const char* data, int64_t bytes, int64_t offset) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;  // a write of nothing: no room left
    data += n, bytes -= n, offset += n;
  }
  return 0;
}

int read_all(int fd, char* data, int64_t bytes, int64_t offset) {
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, data, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return ENODATA;
    data += n, bytes -= n, offset += n;
  }
  return 0;
}

}  // namespace

void DiskTransfer::wait() const {
  if (done_.valid()) done_.get();
}

bool DiskTransfer::ready() const {
  return !done_.valid() || done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

DiskTier::DiskTier(DiskTierOptions options) : options_(std::move(options)), direct_(options_.direct) {
  KUAFU_CHECK(!options_.dir.empty(), options_.dir_key, " is empty: name a folder on a local disk for the disk tier");
  std::error_code error;
  KUAFU_CHECK(fs::is_directory(options_.dir, error), options_.dir_key, " = ", options_.dir,
              ": no such folder (the disk tier makes its scratch folder inside an existing one)");
  KUAFU_CHECK(options_.threads >= 1, "the disk tier needs at least one I/O thread");
  KUAFU_CHECK(options_.budget_bytes >= 0, options_.budget_key, " is negative");
  remove_dead_runs_folders(options_.dir);
  // A run on the disk is one whose limit is memory.
  return_large_freed_blocks_to_the_system();
  for (int n = 0; folder_.empty(); ++n) {
    const fs::path candidate = fs::path(options_.dir) / (kScratchPrefix + std::to_string(::getpid()) + "-" + std::to_string(n));
    if (fs::create_directory(candidate, error)) folder_ = candidate.string();
    KUAFU_CHECK(!error, options_.dir_key, " = ", options_.dir, ": cannot make the scratch folder ", candidate.string(), ": ",
                error.message());
  }
  lock_ = std::make_unique<FolderLock>(folder_, options_.dir_key);
  if (direct_) {  // some file systems (tmpfs, some overlays) refuse O_DIRECT: then the page cache it is
    const std::string probe = folder_ + "/direct-probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
    direct_ = fd >= 0;
    if (fd >= 0) ::close(fd);
    ::unlink(probe.c_str());
  }
  for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { worker(); });
}

DiskTier::~DiskTier() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();  // each drains the queue first
  std::error_code error;
  fs::remove_all(folder_, error);
}

std::string DiskTier::chunk_path(int64_t chunk) const { return folder_ + "/chunk-" + std::to_string(chunk) + ".bin"; }

void DiskTier::fail_io(const char* doing, int64_t chunk, int64_t bytes, const std::string& cause) const {
  fail(detail::concat("disk tier (", options_.dir_key, " = ", options_.dir, "): ", doing, " chunk ", chunk, " (", mib(bytes),
                      ") at ", chunk_path(chunk), " failed: ", cause));
}

int DiskTier::open_chunk(int64_t chunk, int flags, const char* doing, int64_t bytes) const {
  const int fd = ::open(chunk_path(chunk).c_str(), flags | O_CLOEXEC | (direct_ ? O_DIRECT : 0), 0600);
  if (fd < 0) fail_io(doing, chunk, bytes, std::strerror(errno));
  return fd;
}

DiskTransfer DiskTier::enqueue(int64_t chunk, std::function<void(char*)> body) {
  auto promise = std::make_shared<std::promise<void>>();
  std::shared_future<void> done = promise->get_future().share();
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::shared_future<void> before;
    if (const auto it = last_.find(chunk); it != last_.end()) before = it->second;
    last_[chunk] = done;
    const auto finished = [](const std::shared_future<void>& f) { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; };
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), finished), pending_.end());
    pending_.push_back(done);
    // Jobs leave the queue in order, so a chunk's earlier transfer is running or done when this one starts.
    queue_.push_back([promise, before, body = std::move(body)](char* bounce) {
      try {
        if (before.valid()) before.wait();  // its failure is its own transfer's to report
        body(bounce);
        promise->set_value();
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    });
  }
  wake_.notify_one();
  return DiskTransfer(done);
}

void DiskTier::worker() {
  const std::unique_ptr<char, decltype(&std::free)> bounce(static_cast<char*>(std::aligned_alloc(kAlign, kBounceBytes)), &std::free);
  for (;;) {
    std::function<void(char*)> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job(bounce.get());
  }
}

DiskTransfer DiskTier::write(int64_t chunk, const void* data, int64_t bytes) {
  KUAFU_CHECK(bytes >= 0 && (bytes == 0 || data != nullptr), "disk tier: chunk ", chunk, " written from no memory");
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sizes_.find(chunk);
    // On disk every file takes its length rounded up to O_DIRECT's alignment.
    const int64_t after = held_ - (it == sizes_.end() ? 0 : padded(it->second)) + padded(bytes);
    KUAFU_CHECK(options_.budget_bytes == 0 || after <= options_.budget_bytes, options_.budget_key, " = ",
                mib(options_.budget_bytes), ": writing chunk ", chunk, " (", mib(bytes), ") would bring the disk tier's files in ",
                folder_, " to ", mib(after), ", over the budget");
    sizes_[chunk] = bytes;
    held_ = after;
    peak_ = std::max(peak_, held_);
  }
  const char* from = static_cast<const char*>(data);
  return enqueue(chunk, [this, chunk, from, bytes](char* bounce) { write_file(chunk, from, bytes, bounce); });
}

DiskTransfer DiskTier::read(int64_t chunk, void* data, int64_t bytes) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sizes_.find(chunk);
    KUAFU_CHECK(it != sizes_.end(), "disk tier: chunk ", chunk, " was never written to ", folder_, " (or was dropped)");
    KUAFU_CHECK(it->second == bytes, "disk tier: chunk ", chunk, " holds ", it->second, " bytes, not the ", bytes, " asked for");
  }
  KUAFU_CHECK(bytes == 0 || data != nullptr, "disk tier: chunk ", chunk, " read into no memory");
  char* into = static_cast<char*>(data);
  return enqueue(chunk, [this, chunk, into, bytes](char* bounce) { read_file(chunk, into, bytes, bounce); });
}

void DiskTier::drop(int64_t chunk) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sizes_.find(chunk);
    if (it == sizes_.end()) return;
    held_ -= padded(it->second);
    sizes_.erase(it);
  }
  const std::string path = chunk_path(chunk);
  enqueue(chunk, [path](char*) { ::unlink(path.c_str()); });
}

void DiskTier::wait_all() {
  std::vector<std::shared_future<void>> waiting;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    waiting.swap(pending_);
  }
  for (const auto& f : waiting) f.get();
}

void DiskTier::write_file(int64_t chunk, const char* data, int64_t bytes, char* bounce) {
  const auto start = std::chrono::steady_clock::now();
  const int fd = open_chunk(chunk, O_WRONLY | O_CREAT | O_TRUNC, "writing", bytes);
  for (int64_t done = 0; done < bytes;) {
    const int64_t piece = std::min(kBounceBytes, bytes - done);
    const char* from = data + done;
    int64_t length = piece;
    if (direct_ && !aligned(from, piece)) {  // through the bounce buffer, the tail zero-padded
      length = padded(piece);
      std::memcpy(bounce, from, static_cast<size_t>(piece));
      std::memset(bounce + piece, 0, static_cast<size_t>(length - piece));
      from = bounce;
    }
    if (const int error = write_all(fd, from, length, done); error != 0) {
      ::close(fd);
      const bool full = error == ENOSPC || error == EDQUOT || error == EFBIG;
      fail_io("writing", chunk, bytes,
              std::string(std::strerror(error)) +
                  (full ? " (the disk is full: free space there, lower " + options_.budget_key + " or choose another " + options_.dir_key + ")"
                        : ""));
    }
    done += piece;
  }
  if (::close(fd) != 0) fail_io("writing", chunk, bytes, std::strerror(errno));
  const std::lock_guard<std::mutex> lock(mutex_);
  totals_.bytes_written += bytes;
  totals_.write_seconds += seconds_since(start);
}

void DiskTier::read_file(int64_t chunk, char* data, int64_t bytes, char* bounce) {
  const auto start = std::chrono::steady_clock::now();
  const int fd = open_chunk(chunk, O_RDONLY, "reading", bytes);
  for (int64_t done = 0; done < bytes;) {
    const int64_t piece = std::min(kBounceBytes, bytes - done);
    char* into = data + done;
    const bool through_bounce = direct_ && !aligned(into, piece);
    const int error = read_all(fd, through_bounce ? bounce : into, through_bounce ? padded(piece) : piece, done);
    if (error != 0) {
      ::close(fd);
      fail_io("reading", chunk, bytes,
              error == ENODATA ? std::string("the file ends early (changed outside the run?)") : std::string(std::strerror(error)));
    }
    if (through_bounce) std::memcpy(into, bounce, static_cast<size_t>(piece));
    done += piece;
  }
  ::close(fd);
  const std::lock_guard<std::mutex> lock(mutex_);
  totals_.bytes_read += bytes;
  totals_.read_seconds += seconds_since(start);
}

int64_t DiskTier::bytes_held() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return held_;
}

int64_t DiskTier::peak_bytes() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

DiskTier::Totals DiskTier::totals() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return totals_;
}

}  // namespace kuafu::memory

// Gemini's third tier (issue 55): a run's chunks as files on a local disk, under the device and host tiers.
//
// The files are scratch. Each run makes its own folder, <memory.disk_dir>/kuafu-scratch-<pid>-<n>, holds its
// lock for its whole life (so no two runs share one), removes it when the tier is destroyed, and removes the
// folders that runs which died left behind (their lock is free). A resume never reads them: checkpoints stay
// the only source of truth.
//
// Reads and writes run on background threads with pread/pwrite, bypassing the page cache (O_DIRECT) where
// the file system allows it, through aligned bounce buffers when the caller's memory or length is not
// aligned. The caller waits for a transfer when it needs the bytes, which is how a prefetch overlaps
// compute. A full disk, an I/O error or a short transfer is a kuafu::Error naming the chunk, the file and
// the cause, raised by that wait: never a silently wrong chunk.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/util/folder_lock.h"

namespace kuafu::memory {

struct DiskTierOptions {
  std::string dir;           // the folder the run's scratch folder is made in (memory.disk_dir); must exist
  int64_t budget_bytes = 0;  // most bytes the run's chunk files may hold (memory.disk_budget_gb); 0: no limit
  int threads = 2;           // background I/O threads
  bool direct = true;        // O_DIRECT where the file system takes it (else the page cache is used)
  bool read_ahead = true;    // the tier's users read what comes next while the current chunk is used
  std::string dir_key = "memory.disk_dir", budget_key = "memory.disk_budget_gb";  // named in errors
};

// A queued read or write.
class DiskTransfer {
 public:
  DiskTransfer() = default;
  explicit DiskTransfer(std::shared_future<void> done) : done_(std::move(done)) {}
  // Blocks until the transfer is done; throws its kuafu::Error if it failed.
  void wait() const;
  bool ready() const;

 private:
  std::shared_future<void> done_;
};

class DiskTier {
 public:
  explicit DiskTier(DiskTierOptions options);
  // Waits for the queued transfers, then removes the scratch folder.
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Queues writing `bytes` from `data` as chunk `chunk` (replacing what it held). `data` must stay valid
  // and unchanged until the transfer is waited for. Throws at once when the budget would be exceeded.
  DiskTransfer write(int64_t chunk, const void* data, int64_t bytes);
  // Queues reading chunk `chunk` into `data` (`bytes`: what was written). Transfers of one chunk run in
  // the order they were queued, so a read queued after a write reads what it wrote.
  DiskTransfer read(int64_t chunk, void* data, int64_t bytes);
  // Removes the chunk's file once its queued transfers are done; its bytes leave the budget.
  void drop(int64_t chunk);
  // Waits for every queued transfer (throws the first error among them).
  void wait_all();

  const std::string& folder() const { return folder_; }
  bool direct() const { return direct_; }
  const DiskTierOptions& options() const { return options_; }
  int64_t bytes_held() const;
  int64_t peak_bytes() const;
  // Bytes moved and the seconds the I/O threads spent moving them (summed over threads).
  struct Totals {
    int64_t bytes_written = 0, bytes_read = 0;
    double write_seconds = 0, read_seconds = 0;
  };
  Totals totals() const;

  static constexpr const char* kScratchPrefix = "kuafu-scratch-";

 private:
  // Runs `body` on an I/O thread (with that thread's bounce buffer) after the chunk's earlier transfers.
  DiskTransfer enqueue(int64_t chunk, std::function<void(char* bounce)> body);
  void worker();
  std::string chunk_path(int64_t chunk) const;
  int open_chunk(int64_t chunk, int flags, const char* doing, int64_t bytes) const;
  void write_file(int64_t chunk, const char* data, int64_t bytes, char* bounce);
  void read_file(int64_t chunk, char* data, int64_t bytes, char* bounce);
  [[noreturn]] void fail_io(const char* doing, int64_t chunk, int64_t bytes, const std::string& cause) const;

  DiskTierOptions options_;
  std::string folder_;
  std::unique_ptr<FolderLock> lock_;
  bool direct_ = true;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void(char*)>> queue_;
  bool stopping_ = false;
  std::map<int64_t, int64_t> sizes_;                   // each chunk's bytes (as written)
  std::map<int64_t, std::shared_future<void>> last_;   // each chunk's latest queued transfer
  std::vector<std::shared_future<void>> pending_;      // every queued transfer not yet waited for by wait_all
  int64_t held_ = 0, peak_ = 0;
  Totals totals_;
  std::vector<std::thread> threads_;
};

}  // namespace kuafu::memory

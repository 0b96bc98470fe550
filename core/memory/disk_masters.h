// Gemini's master chunks on the disk tier (issue 55): the float32 masters, optimizer state and gradient
// shard of the chunks host memory cannot hold live in files of the run's scratch folder, and come into host
// memory only while they are used: a gradient while a backward adds to it, a chunk's masters and state while
// the optimizer steps them (chunk after chunk, the next one read while the current one steps).
//
// Each chunk has two homes, host tensors whose memory is given back between uses (storage_memory.h), so that
// the views taken of them (the optimizer's pieces, their .grad, the optimizer's state slots) stay valid:
//   record [(1 + slots) * n] float32: the master shard, then each optimizer state slot;
//   grad   [n] float32: the averaged gradient shard (zeros until one is written).
// Writes go behind: a home's memory is given back once its file holds it, and a home wanted again before
// then is used as it is. At most kAhead + 1 + kBehind chunks' homes are in memory at once.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "core/memory/disk_tier.h"

namespace kuafu::memory {

// A host tensor of `numel` float32 elements for a home on the disk tier: its memory is mapped from the
// operating system and returned to it when given back (the apps keep large blocks on the heap for reuse,
// where these homes, taken and given back every step in sizes that do not nest, would fragment it: a
// 73-layer GPT's run once held 24 GiB for 10 GiB in use), page-aligned for O_DIRECT.
torch::Tensor mapped_host_tensor(int64_t numel);

class DiskMasters {
 public:
  static constexpr int kAhead = 1;   // chunks read ahead of the one in use
  static constexpr int kBehind = 1;  // chunks whose writes may still be going on after their use
  static constexpr int kChunksAtOnce = kAhead + 1 + kBehind;  // chunks whose homes may be in memory together

  explicit DiskMasters(DiskTierOptions options);
  ~DiskMasters();
  DiskMasters(const DiskMasters&) = delete;
  DiskMasters& operator=(const DiskMasters&) = delete;

  // Chunk `c` lives on the disk from now: `record`'s values are written to its file, and both tensors'
  // memory is given back (the gradient counts as zeros).
  void adopt(int64_t c, const torch::Tensor& record, const torch::Tensor& grad);
  // Chunk c leaves the disk (a placement found room for it in memory): its record and gradient are brought
  // into memory (read, or zeros) and stay there, held by the tensors adopt() was given; its files go.
  void take_back(int64_t c);
  bool holds(int64_t c) const { return homes_.count(c) > 0; }
  bool empty() const { return homes_.empty(); }
  int64_t chunks() const { return static_cast<int64_t>(homes_.size()); }

  // A backward's gradient: bring_gradient(c) puts chunk c's in memory (read, or zeros), the caller adds
  // to it, and send_gradient(c) writes it behind.
  void bring_gradient(int64_t c);
  void send_gradient(int64_t c);
  // Every gradient is zeros again (zero_grad): their files are dropped, none is read before it is next written.
  void forget_gradients();

  // Runs `body(c)` for every chunk on the disk in chunk order, with its record (and, with `gradients`, its
  // gradient) in memory, reading the next chunk while `body` runs. `changed`: the record is written back
  // (else it is only let go); the gradient is let go unchanged.
  void for_each(bool gradients, bool changed, const std::function<void(int64_t c)>& body);
  // Chunk c's record in memory (a checkpoint reads or loads one chunk at a time) until close(c, changed).
  void open(int64_t c);
  void close(int64_t c, bool changed);

  // Waits for the writes behind and gives their memory back; throws the first I/O error.
  void settle();

  // Bytes of homes in memory now and at most so far; the most any for_each/backward may hold for chunks
  // whose record and gradient take `record_bytes` and `grad_bytes`.
  int64_t host_bytes() const { return host_bytes_; }
  int64_t peak_host_bytes() const { return peak_host_bytes_; }
  static int64_t most_host_bytes(int64_t record_bytes, int64_t grad_bytes) {
    return kChunksAtOnce * (record_bytes + grad_bytes);
  }
  const DiskTier& disk() const { return disk_; }
  double wait_seconds() const { return wait_seconds_; }  // time spent waiting for reads and writes

 private:
  enum class Where { kAway, kReading, kHere, kWriting };
  struct Home {
    int64_t key = 0;        // its file on the disk tier
    torch::Tensor tensor;   // the home in memory while here (its storage holds no memory while away)
    Where where = Where::kAway;
    bool has_file = false;  // false: a gradient of zeros (no file read)
    DiskTransfer transfer;  // the read or write going on
  };
  struct Chunk {
    Home record, grad;
  };
  void fetch(Home& home);            // starts bringing it into memory (nothing when it is there)
  void wait_here(Home& home);        // until it is in memory
  void send(Home& home);             // starts writing it (its memory stays until retire_writes)
  void write_behind(Home& home);     // send, leaving at most kBehind homes being written
  void let_go(Home& home);           // its memory back, unchanged (its file is current)
  void finish_write(Home& home);     // waits for its write; it stays in memory
  void take_memory(Home& home);
  void give_memory(Home& home);
  void retire_writes(size_t keep);   // at most `keep` homes left writing behind

  DiskTier disk_;
  std::map<int64_t, Chunk> homes_;
  std::deque<Home*> behind_;         // homes being written, oldest first
  int64_t host_bytes_ = 0, peak_host_bytes_ = 0;
  double wait_seconds_ = 0;
};

}  // namespace kuafu::memory

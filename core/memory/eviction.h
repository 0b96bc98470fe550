// Gemini's eviction choice: after warm-up the chunk access order of one step is known, so when the fast
// tier would overflow the chunk evicted is the one whose next use lies furthest ahead (Belady's rule,
// optimal for a known sequence); a chunk never used again goes first.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace kuafu::memory {

class AccessTrace {
 public:
  AccessTrace() = default;
  // The chunks one training step touches, in order (recorded during warm-up). The step repeats.
  explicit AccessTrace(std::vector<int64_t> accesses);

  const std::vector<int64_t>& accesses() const { return accesses_; }
  // Position of `chunk`'s first use strictly after position `now`, wrapping into the next step
  // (positions past the end count from accesses().size()); -1 when the step never uses it.
  int64_t next_use(int64_t chunk, int64_t now) const;

 private:
  std::vector<int64_t> accesses_;
  std::map<int64_t, std::vector<int64_t>> positions_;  // chunk -> its positions, ascending
};

// The candidate to evict at position `now`: furthest next use, never-used-again first, ties to the
// lower chunk id. `candidates` must not be empty.
int64_t furthest_next_use(const std::vector<int64_t>& candidates, const AccessTrace& trace, int64_t now);

}  // namespace kuafu::memory

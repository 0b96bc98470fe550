#include "core/memory/eviction.h"

#include <algorithm>
#include <limits>

#include "core/util/error.h"

namespace kuafu::memory {

AccessTrace::AccessTrace(std::vector<int64_t> accesses) : accesses_(std::move(accesses)) {
  for (int64_t i = 0; i < static_cast<int64_t>(accesses_.size()); ++i) positions_[accesses_[i]].push_back(i);
}

int64_t AccessTrace::next_use(int64_t chunk, int64_t now) const {
  const auto found = positions_.find(chunk);
  if (found == positions_.end()) return -1;
  const auto& at = found->second;
  const int64_t step = static_cast<int64_t>(accesses_.size());
  const int64_t in_step = ((now % step) + step) % step;
  const int64_t step_start = now - in_step;
  const auto later = std::upper_bound(at.begin(), at.end(), in_step);
  return later != at.end() ? step_start + *later : step_start + step + at.front();
}

int64_t furthest_next_use(const std::vector<int64_t>& candidates, const AccessTrace& trace, int64_t now) {
  KUAFU_CHECK(!candidates.empty(), "eviction: no chunk can be evicted");
  int64_t best = candidates.front();
  int64_t best_use = -2;
  for (int64_t chunk : candidates) {
    int64_t use = trace.next_use(chunk, now);
    if (use < 0) use = std::numeric_limits<int64_t>::max();  // never used again: evict first
    if (use > best_use || (use == best_use && chunk < best)) {
      best = chunk;
      best_use = use;
    }
  }
  return best;
}

}  // namespace kuafu::memory

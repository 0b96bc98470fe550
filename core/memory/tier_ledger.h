// The two memory tiers Gemini places chunks in, and the ledger that enforces their budgets: the fast
// tier (the device the blocks compute on) and the slow tier (host memory). Every chunk buffer Gemini
// allocates or frees is entered here, so the placement policy can ask whether something fits and a
// budget is never exceeded silently. On a CPU-only machine both tiers are host memory: the fast tier's
// budget is then enforced by this accounting alone, which is what lets the placement logic run and be
// tested without a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace kuafu::memory {

enum class Tier { kFast = 0, kSlow = 1 };

const char* tier_name(Tier tier);

struct TierBudgets {
  int64_t fast_bytes = 0;  // 0: unlimited
  int64_t slow_bytes = 0;  // 0: unlimited
};

class TierLedger {
 public:
  explicit TierLedger(TierBudgets budgets = {});

  // True when `bytes` more model data fit in `tier` next to what it holds (and, on the fast tier, the
  // non-model memory of this moment).
  bool fits(Tier tier, int64_t bytes) const;
  // Enters `bytes` of model data in `tier`; throws kuafu::Error naming `what` when they do not fit.
  void add(Tier tier, int64_t bytes, const std::string& what);
  void remove(Tier tier, int64_t bytes);
  // The fast tier's non-model memory (activations, temporaries) at this moment: measured during warm-up,
  // taken from the warm-up trace afterwards. Counts towards the fast budget and its peak.
  void set_non_model(int64_t bytes);

  int64_t budget(Tier tier) const { return budgets_[index(tier)]; }
  int64_t model_bytes(Tier tier) const { return used_[index(tier)]; }
  int64_t non_model_bytes() const { return non_model_; }
  int64_t peak_non_model_bytes() const { return peak_non_model_; }
  // Most bytes accounted at any moment: model data (plus non-model data on the fast tier).
  int64_t peak_bytes(Tier tier) const { return peak_[index(tier)]; }

 private:
  static size_t index(Tier tier) { return static_cast<size_t>(tier); }
  int64_t accounted(Tier tier) const;
  void update_peak(Tier tier);

  std::array<int64_t, 2> budgets_;
  std::array<int64_t, 2> used_{0, 0};
  std::array<int64_t, 2> peak_{0, 0};
  int64_t non_model_ = 0;
  int64_t peak_non_model_ = 0;
};

// Bytes as "12.3 MiB" for messages.
std::string mib(int64_t bytes);

}  // namespace kuafu::memory

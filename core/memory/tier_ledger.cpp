#include "core/memory/tier_ledger.h"

#include <algorithm>
#include <cstdio>

#include "core/util/error.h"

namespace kuafu::memory {

const char* tier_name(Tier tier) { return tier == Tier::kFast ? "fast (device)" : "slow (host)"; }

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

TierLedger::TierLedger(TierBudgets budgets) : budgets_{budgets.fast_bytes, budgets.slow_bytes} {
  KUAFU_CHECK(budgets.fast_bytes >= 0 && budgets.slow_bytes >= 0, "memory budgets must not be negative");
}

int64_t TierLedger::accounted(Tier tier) const {
  return used_[index(tier)] + (tier == Tier::kFast ? non_model_ : 0);
}

bool TierLedger::fits(Tier tier, int64_t bytes) const {
  const int64_t budget = budgets_[index(tier)];
  return budget == 0 || accounted(tier) + bytes <= budget;
}

void TierLedger::add(Tier tier, int64_t bytes, const std::string& what) {
  KUAFU_CHECK(bytes >= 0, "negative allocation for ", what);
  if (!fits(tier, bytes)) {
    throw Error(detail::concat("the ", tier_name(tier), " memory budget of ", mib(budget(tier)), " cannot hold ", what,
                               bytes > 0 ? " (" + mib(bytes) + ")" : std::string(), ": ", mib(used_[index(tier)]), " of model data",
                               tier == Tier::kFast ? " and " + mib(non_model_) + " of activations" : std::string(),
                               " are in use there and nothing more can be moved out. Raise memory.",
                               tier == Tier::kFast ? "device_budget_mb" : "host_budget_mb",
                               tier == Tier::kFast ? ", or lower what one block needs (train.micro_batch_size, memory.chunk_mb)"
                                                   : ", or keep more on the device"));
  }
  used_[index(tier)] += bytes;
  update_peak(tier);
}

void TierLedger::remove(Tier tier, int64_t bytes) {
  used_[index(tier)] -= bytes;
  KUAFU_CHECK(used_[index(tier)] >= 0, "memory ledger: more bytes freed than held in the ", tier_name(tier), " tier");
}

void TierLedger::set_non_model(int64_t bytes) {
  non_model_ = std::max<int64_t>(0, bytes);
  peak_non_model_ = std::max(peak_non_model_, non_model_);
  update_peak(Tier::kFast);
}

void TierLedger::update_peak(Tier tier) { peak_[index(tier)] = std::max(peak_[index(tier)], accounted(tier)); }

}  // namespace kuafu::memory

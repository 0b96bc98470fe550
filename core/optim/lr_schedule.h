// Learning-rate schedules: a linear warm-up followed by constant, cosine, linear, polynomial or
// multi-step decay. A schedule is a pure function of the step, so a resumed run continues it exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kuafu::optim {

enum class ScheduleKind { kConstant, kCosine, kLinear, kPolynomial, kMultiStep };

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kCosine;
  double peak_lr = 1e-3;
  double min_lr = 0.0;          // where cosine, linear and polynomial decay end
  int64_t warmup_steps = 0;     // linear from peak / (warmup + 1) up to peak
  int64_t total_steps = 1;      // decay reaches min_lr here
  double power = 1.0;           // polynomial: (1 - progress)^power
  std::vector<int64_t> milestones;  // multi-step: lr *= gamma at each of these steps (ascending)
  double gamma = 0.1;
};

class LrSchedule {
 public:
  explicit LrSchedule(ScheduleOptions options);  // kuafu::Error on inconsistent options
  // The rate for optimizer step `step` (0-based: the first update uses lr(0)).
  double lr(int64_t step) const;
  const ScheduleOptions& options() const { return options_; }

  static ScheduleKind parse_kind(const std::string& name);  // "constant", "cosine", ...
  static const std::vector<std::string>& kind_names();

 private:
  ScheduleOptions options_;
};

}  // namespace kuafu::optim

#include "core/train/progress.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>

namespace kuafu::train {

Progress::Progress(int64_t first_step, int64_t total_steps, int64_t log_interval, const std::string& mode)
    : first_step_(first_step),
      total_steps_(total_steps),
      log_interval_(log_interval),
      bar_(mode == "bar" || (mode == "auto" && isatty(STDOUT_FILENO))),
      start_(std::chrono::steady_clock::now()) {}

std::string Progress::format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60));
  } else if (s >= 60) {
    std::snprintf(text, sizeof text, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(text, sizeof text, "%llds", static_cast<long long>(s));
  }
  return text;
}

void Progress::update(int64_t step, const std::string& fields) {
  const int64_t done = step + 1;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done_here = done - first_step_;
  const double eta = done_here > 0 ? elapsed / done_here * (total_steps_ - done) : 0.0;
  std::ostringstream line;
  if (bar_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * done / std::max<int64_t>(1, total_steps_));
    line << "\r[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] " << done << "/"
         << total_steps_ << " | " << fields << " | ETA " << format_duration(eta) << "\033[K";
    std::cout << line.str() << std::flush;
    bar_open_ = true;
    return;
  }
  if (done % log_interval_ != 0 && done != total_steps_ && done_here != 1) return;
  line << "step " << done << "/" << total_steps_ << " | " << fields << " | ETA " << format_duration(eta);
  std::cout << line.str() << std::endl;
}

void Progress::print_line(const std::string& line) {
  if (bar_open_) std::cout << "\r\033[K";
  std::cout << line << std::endl;
  bar_open_ = false;
}

void Progress::finish() {
  if (bar_open_) std::cout << std::endl;
  bar_open_ = false;
}

}  // namespace kuafu::train

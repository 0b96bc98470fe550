// Training progress for people: a one-line bar with ETA redrawn in place on a terminal, plain log
// lines every N steps otherwise (CI logs, files).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kuafu::train {

class Progress {
 public:
  // mode: "auto" (bar when stdout is a terminal), "bar" or "plain". Only the printing rank calls it.
  Progress(int64_t first_step, int64_t total_steps, int64_t log_interval, const std::string& mode);

  // After step `step` (0-based) completed; `fields` is the ready-made "loss 3.21 | lr ..." text.
  void update(int64_t step, const std::string& fields);
  // Ends the bar line so other output starts on a fresh line.
  void finish();
  void print_line(const std::string& line);  // a line that does not break the bar

  static std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

 private:
  int64_t first_step_;
  int64_t total_steps_;
  int64_t log_interval_;
  bool bar_;
  bool bar_open_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kuafu::train

#include "core/util/logging.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>

namespace kuafu::log {
namespace {

struct State {
  std::mutex mutex;
  int rank = 0;
  int world_size = 1;
  bool prints = true;
  Level level = Level::kInfo;
  std::ofstream file;
};

State& state() {
  static State s;
  return s;
}

const char* level_name(Level level) {
  switch (level) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warning";
    case Level::kError: return "error";
  }
  return "";
}

}  // namespace

void configure(int rank, int world_size, const std::string& log_dir, bool all_ranks_print) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.rank = rank;
  s.world_size = world_size;
  s.prints = rank == 0 || all_ranks_print;
  if (s.file.is_open()) s.file.close();
  if (!log_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(log_dir, error);
    KUAFU_CHECK(!error, "cannot create the log folder ", log_dir, ": ", error.message());
    const auto path = std::filesystem::path(log_dir) / ("rank" + std::to_string(rank) + ".log");
    s.file.open(path, std::ios::app);
    KUAFU_CHECK(s.file.good(), "cannot open log file ", path.string());
  }
}

void set_level(Level level) { state().level = level; }

void write(Level level, const std::string& message) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (level < s.level) return;
  std::string prefix;
  if (s.world_size > 1) prefix = "[rank " + std::to_string(s.rank) + "] ";
  if (level != Level::kInfo) prefix += std::string(level_name(level)) + ": ";
  if (s.prints || level >= Level::kError) {
    std::ostream& out = level >= Level::kWarn ? std::cerr : std::cout;
    out << prefix << message << std::endl;
  }
  if (s.file.is_open()) {
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
    s.file << stamp << ' ' << prefix << message << '\n';
    s.file.flush();
  }
}

}  // namespace kuafu::log

// One logger for the whole process: rank 0 prints to the terminal by default, every rank can also
// append to its own log file. Thread-safe; lines carry the rank when the world has several.
#pragma once

#include <string>

#include "core/util/error.h"

namespace kuafu::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Called once after the rank is known. `log_dir` empty: no per-rank file.
void configure(int rank, int world_size, const std::string& log_dir = "", bool all_ranks_print = false);
void set_level(Level level);

void write(Level level, const std::string& message);
inline void debug(const std::string& m) { write(Level::kDebug, m); }
inline void info(const std::string& m) { write(Level::kInfo, m); }
inline void warn(const std::string& m) { write(Level::kWarn, m); }
inline void error(const std::string& m) { write(Level::kError, m); }

// Streams parts into one message: log::infof("step ", step, " loss ", loss).
template <typename... Parts>
void infof(Parts&&... parts) { info(::kuafu::detail::concat(std::forward<Parts>(parts)...)); }
template <typename... Parts>
void warnf(Parts&&... parts) { warn(::kuafu::detail::concat(std::forward<Parts>(parts)...)); }

}  // namespace kuafu::log

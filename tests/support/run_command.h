// Running a command line from a test (the app binaries, the Python references) and keeping what it
// printed.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kuafu::testing {

struct CommandResult {
  int exit_code = -1;  // 128 when it did not exit normally
  std::string output;  // stdout and stderr
};

inline CommandResult run_command(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  CommandResult result;
  if (!pipe) return result;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return result;
}

}  // namespace kuafu::testing

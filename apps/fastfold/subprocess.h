// Running an external program (MMseqs2) to completion from the data recipes: its output captured, and a
// failure turned into a kuafu::Error that shows the command line and the program's last lines.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kuafu::fold {

// The full path of `program`: itself when it contains a '/' and is an executable file, else the first
// executable file of that name in the folders of $PATH (empty entries skipped). "" when there is none.
std::string find_program(const std::string& program);

// Runs argv (argv[0] found by find_program) with stdin from /dev/null and stdout and stderr captured
// together; returns that output (its last `keep_bytes` when longer). kuafu::Error naming the command line
// when the program is not found on $PATH or cannot be started, and with the output's last lines when it
// exits non-zero or is killed by a signal.
std::string run_program(const std::vector<std::string>& argv, size_t keep_bytes = 1 << 20);

// The command line as a shell would read it (arguments with spaces or quotes quoted): for messages.
std::string command_line(const std::vector<std::string>& argv);

}  // namespace kuafu::fold

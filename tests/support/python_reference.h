// The Python references (transformers, diffusers, ...) that scripts/setup pins into .venv, run from a
// test: a script of tests/python with arguments. A missing interpreter or script fails the test; it
// never skips it.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "tests/support/json_lines.h"
#include "tests/support/run_command.h"

namespace kuafu::testing {

using PythonRun = CommandResult;

inline PythonRun run_python_reference(const std::string& script, const std::string& args) {
  namespace fs = std::filesystem;
  const fs::path python = fs::path(KUAFU_SOURCE_DIR) / ".venv/bin/python";
  const fs::path path = fs::path(KUAFU_SOURCE_DIR) / "tests/python" / script;
  if (!fs::exists(python) || !fs::exists(path)) {
    ADD_FAILURE() << "the Python reference " << path << " needs " << python << ": run scripts/setup";
    return {};
  }
  // Offline: the references build their tiny models themselves.
  return run_command("HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 " + python.string() + " " +
                     path.string() + " " + args);
}

}  // namespace kuafu::testing

// Small helpers shared by tests: a fresh temporary folder, and the message of the kuafu::Error an
// action throws.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "core/util/error.h"

namespace kuafu::testing {

// An empty folder unique to this test process, under the system's temporary folder.
inline std::filesystem::path temp_dir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("kuafu_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// What `action` throws as kuafu::Error, or "" when it throws nothing.
inline std::string error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kuafu::testing

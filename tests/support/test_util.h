// Small helpers shared by tests: a fresh temporary folder (and a fixture that gives each test one), the
// message of the kuafu::Error an action throws, and a substring check whose failure shows the whole text.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <utility>

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

// A test with its own empty folder, named `prefix` + the test's name and removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  explicit TempDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override { dir_ = temp_dir(prefix_ + ::testing::UnitTest::GetInstance()->current_test_info()->name()); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string prefix_;
  std::filesystem::path dir_;
};

// What `action` throws as kuafu::Error, or "" when it throws nothing.
inline std::string error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The same, but a test failure when nothing is thrown (for actions that must fail).
inline std::string expected_error(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a kuafu::Error";
  return "";
}

// gmock's HasSubstr without linking gmock; the failure shows the whole text.
inline ::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' is not in:\n" << text;
}

}  // namespace kuafu::testing

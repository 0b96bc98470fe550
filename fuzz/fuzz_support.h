// What every harness shares. Bad input must end in kuafu::Error, the named error a user can act on;
// anything else (a crash, a sanitizer report, another exception escaping, a hang, a huge allocation)
// is a bug, and libFuzzer reports it with the input that caused it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

#include "core/util/error.h"

namespace kuafu::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A folder of this process's own under /dev/shm (memory, not disk) for loaders that read files.
class Scratch {
 public:
  explicit Scratch(const std::string& harness)
      : dir_("/dev/shm/kuafu-fuzz-" + harness + "-" + std::to_string(::getpid())) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // Writes `bytes` as file `name` of the folder (replacing it) and returns its path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string file = path(name);
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return file;
  }
  void remove(const std::string& name) const { std::filesystem::remove(path(name)); }

 private:
  std::string dir_;
};

// The input cut at the first `separator` (a line of its own in the seeds), for harnesses that read
// two files; the second part is empty when there is none. memmem lets libFuzzer learn the separator.
inline std::pair<std::string_view, std::string_view> split_at(std::string_view input, std::string_view separator) {
  const void* found = ::memmem(input.data(), input.size(), separator.data(), separator.size());
  if (!found) return {input, {}};
  const size_t at = static_cast<const char*>(found) - input.data();
  return {input.substr(0, at), input.substr(at + separator.size())};
}

// Runs `parse`: a kuafu::Error is the right answer to bad input; any other exception escapes.
template <typename Parse>
void expect_named_errors(Parse&& parse) {
  try {
    parse();
  } catch (const kuafu::Error&) {
  }
}

}  // namespace kuafu::fuzz

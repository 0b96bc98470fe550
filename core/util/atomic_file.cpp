#include "core/util/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/util/error.h"

namespace kuafu {
namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  KUAFU_CHECK(fd >= 0, "cannot open ", path, " to sync it: ", errno_text());
  const int rc = ::fsync(fd);
  ::close(fd);
  KUAFU_CHECK(rc == 0, "fsync of ", path, " failed: ", errno_text());
}

void rename_durable(const std::string& from, const std::string& to) {
  KUAFU_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ", errno_text());
  auto parent = std::filesystem::path(to).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

namespace {

// Removes the <target>.partial-<pid> folders whose process is gone (killed before it finished): nothing
// else cleans them. A live process's folder stays (writers into one path from two hosts of a shared file
// system at once are not supported).
void remove_dead_partials(const std::filesystem::path& target) {
  const std::string prefix = target.filename().string() + ".partial-";
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(target.parent_path(), error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(digits));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) std::filesystem::remove_all(entry.path(), error);
  }
}

}  // namespace

void write_folder_atomic(const std::string& dir, const std::function<void(const std::filesystem::path& building)>& fill) {
  namespace fs = std::filesystem;
  KUAFU_CHECK(!fs::exists(dir), dir, " already exists; write into a new folder (nothing saved is overwritten)");
  const fs::path target = fs::absolute(dir);
  std::error_code error;
  fs::create_directories(target.parent_path(), error);
  KUAFU_CHECK(!error, "cannot create ", target.parent_path().string(), ": ", error.message());
  remove_dead_partials(target);
  const fs::path building = target.string() + ".partial-" + std::to_string(::getpid());
  fs::remove_all(building, error);
  fs::create_directory(building, error);
  KUAFU_CHECK(!error, "cannot create ", building.string(), ": ", error.message());
  try {
    fill(building);
  } catch (...) {
    fs::remove_all(building, error);  // a failed write leaves nothing behind
    throw;
  }
  rename_durable(building.string(), target.string());
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic_streamed(path, [&](const ByteSink& write) { write(bytes.data(), bytes.size()); });
}

FileSum write_file_atomic_streamed(const std::string& path, const std::function<void(const ByteSink& write)>& fill) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  KUAFU_CHECK(fd >= 0, "cannot create ", tmp, ": ", errno_text());
  FileSum sum;
  uLong crc = crc32(0L, Z_NULL, 0);
  const ByteSink write = [&](const void* data, size_t bytes) {
    const char* from = static_cast<const char*>(data);
    size_t written = 0;
    while (written < bytes) {
      const ssize_t n = ::write(fd, from + written, bytes - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot write " + tmp + ": " + errno_text());
      written += static_cast<size_t>(n);
    }
    // zlib takes at most 4 GiB per call.
    for (size_t done = 0; done < bytes;) {
      const auto step = static_cast<uInt>(std::min<size_t>(bytes - done, 1u << 30));
      crc = crc32(crc, reinterpret_cast<const Bytef*>(from + done), step);
      done += step;
    }
    sum.bytes += bytes;
  };
  try {
    fill(write);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());  // a failed write leaves nothing behind
    throw;
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) {
    ::unlink(tmp.c_str());
    fail("fsync of " + tmp + " failed: " + errno_text());
  }
  try {
    rename_durable(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());  // e.g. `path` is a folder: the temporary must not stay beside it
    throw;
  }
  sum.crc32 = static_cast<uint32_t>(crc);
  return sum;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KUAFU_CHECK(in.good(), "cannot open ", path, ": ", std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

uint32_t file_crc32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KUAFU_CHECK(in.good(), "cannot open ", path, ": ", std::strerror(errno));
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> block(1 << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto n = in.gcount();
    if (n > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(block.data()), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace kuafu

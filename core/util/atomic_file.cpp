#include "core/util/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

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

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  KUAFU_CHECK(fd >= 0, "cannot create ", tmp, ": ", errno_text());
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      fail("cannot write " + tmp + ": " + why);
    }
    written += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) {
    ::unlink(tmp.c_str());
    fail("fsync of " + tmp + " failed: " + errno_text());
  }
  rename_durable(tmp, path);
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

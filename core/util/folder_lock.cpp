#include "core/util/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/util/error.h"

namespace kuafu {

FolderLock::FolderLock(const std::string& folder, const std::string& what) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  KUAFU_CHECK(!error, what, " = ", folder, ": cannot create the folder: ", error.message());
  const std::string path = lock_file(folder);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  KUAFU_CHECK(fd_ >= 0, "cannot open ", path, " (", what, "): ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    // The holder wrote its process id there; read a few bytes only.
    char holder[32] = {};
    const ssize_t got = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string pid(holder, got > 0 ? static_cast<size_t>(got) : 0);
    if (pid.find_first_not_of("0123456789\n") != std::string::npos) pid.clear();
    while (!pid.empty() && pid.back() == '\n') pid.pop_back();
    KUAFU_CHECK(error != EWOULDBLOCK, what, " = ", folder, " is in use by another run (",
                pid.empty() ? std::string("a process") : "process " + pid, " holds ", path,
                "); wait for it to end or choose another ", what);
    fail(detail::concat("cannot lock ", path, " (", what, "): ", std::strerror(error)));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

std::string FolderLock::lock_file(const std::string& folder) { return (std::filesystem::path(folder) / ".kuafu.lock").string(); }

bool FolderLock::held(const std::string& folder) {
  const int fd = ::open(lock_file(folder).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  const bool taken = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // releases the lock if this call took it
  return taken;
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace kuafu

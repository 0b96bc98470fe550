// An exclusive lock on a folder for the life of a run (flock on <folder>/.kuafu.lock), so that two
// runs cannot write the same checkpoints and metrics. The kernel drops the lock whenever the process
// ends, however it ends, so a crashed run never leaves a stale lock behind.
#pragma once

#include <string>

namespace kuafu {

class FolderLock {
 public:
  // Creates `folder` if needed and takes its lock. kuafu::Error naming `what` (e.g. "train.out_dir"),
  // the folder and the process holding the lock when another one does.
  FolderLock(const std::string& folder, const std::string& what);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  // The lock file of `folder` (<folder>/.kuafu.lock).
  static std::string lock_file(const std::string& folder);
  // Whether `folder` has a lock file whose lock a live holder (another process, or another FolderLock of
  // this one) has: false for a folder its run left when it died.
  static bool held(const std::string& folder);
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace kuafu

// Deadline: ends this process when a blocking step outlives its time-out. For steps that cannot be
// interrupted and have no deadline of their own: Gloo's connecting of a group waits for ever in
// Pair::waitUntilConnected when a peer dies while the pairs connect (seen with a peer host's job
// failing at start), where every other rank must fail, naming the group, within dist.timeout_s.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace kuafu::dist {

class Deadline {
 public:
  // Starts counting: unless destroyed within `timeout`, prints "error: <what>" with `hint` to stderr
  // and exits the process with code 1 (no destructors run; the peers' own deadlines end them too).
  Deadline(std::string what, std::chrono::milliseconds timeout, std::string hint);
  ~Deadline();  // the step finished (or threw) in time
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  bool finished_ = false;
  std::thread watcher_;
};

}  // namespace kuafu::dist

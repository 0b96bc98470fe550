#include "core/dist/deadline.h"

#include <cstdio>
#include <cstdlib>

namespace kuafu::dist {

Deadline::Deadline(std::string what, std::chrono::milliseconds timeout, std::string hint) {
  watcher_ = std::thread([this, what = std::move(what), timeout, hint = std::move(hint)] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (done_.wait_for(lock, timeout, [this] { return finished_; })) return;
    std::fprintf(stderr, "error: %s did not finish within %lld s: %s\n", what.c_str(),
                 static_cast<long long>(timeout.count() / 1000), hint.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  });
}

Deadline::~Deadline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
  }
  done_.notify_one();
  watcher_.join();
}

}  // namespace kuafu::dist

// kuafu::Error: the one exception type for problems a user can act on (bad config, file, flag).
// Apps catch it at main, print the message and exit non-zero.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kuafu {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}
}  // namespace detail

// Throws kuafu::Error with the streamed parts when `condition` is false.
#define KUAFU_CHECK(condition, ...)                                    \
  do {                                                                 \
    if (!(condition)) {                                                \
      throw ::kuafu::Error(::kuafu::detail::concat(__VA_ARGS__));      \
    }                                                                  \
  } while (false)

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

}  // namespace kuafu

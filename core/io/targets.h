// Next-token targets that take no part in the loss.
#pragma once

#include <cstdint>

namespace kuafu::io {

// A target the loss skips (prompt tokens, padding): PyTorch's and Hugging Face's -100.
constexpr int64_t kIgnoredTarget = -100;

}  // namespace kuafu::io

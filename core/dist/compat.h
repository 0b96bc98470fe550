// The one place that hides LibTorch c10d version differences (Debian's 1.13 on CPU, 2.x with CUDA).
// Everything else in Kuafu talks to c10d through these names and the functions in collectives.h.
#pragma once

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
#ifdef KUAFU_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace kuafu::dist::compat {

// In 1.13 a backend such as Gloo *is* a c10d::ProcessGroup; from 2.0 on it is a c10d::Backend that a
// ProcessGroup dispatches to. Both expose the same virtual collectives, which is all we use.
#if TORCH_VERSION_MAJOR >= 2
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif
using Work = c10d::Work;

inline bool gloo_supports_dtype(c10::ScalarType type) {
  // Gloo in 1.13 has no bf16 kernels; half travels as fp32 too so both reduced types behave alike.
  return type != c10::kBFloat16 && type != c10::kHalf;
}

}  // namespace kuafu::dist::compat

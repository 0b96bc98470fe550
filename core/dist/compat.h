// The one place that names c10d's classes and hides what differs between CPU (Gloo) and CUDA (NCCL)
// builds. Everything else in Kuafu talks to c10d through these names and the functions in collectives.h.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef KUAFU_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace kuafu::dist::compat {

using Backend = c10d::Backend;  // Gloo or NCCL: the same virtual collectives, which is all we use
using Work = c10d::Work;

// True when this build compiled the NCCL backend (LibTorch with CUDA and KUAFU_WITH_CUDA).
constexpr bool kHasNccl =
#ifdef KUAFU_WITH_CUDA
    true;
#else
    false;
#endif

}  // namespace kuafu::dist::compat

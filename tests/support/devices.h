// The devices a numerical test runs on: the CPU always, and the first GPU where this build has CUDA and
// one is visible, so the same assertions check the CUDA path on a GPU machine (CI has none).
#pragma once

#include <vector>

#include <torch/types.h>

#include "core/util/device.h"

namespace kuafu::testing {

inline std::vector<torch::Device> devices_to_test() {
  std::vector<torch::Device> devices{torch::kCPU};
  if (cuda_available()) devices.emplace_back(torch::kCUDA, 0);
  return devices;
}

}  // namespace kuafu::testing

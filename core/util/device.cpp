#include "core/util/device.h"

#include <torch/cuda.h>
#ifdef KUAFU_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "core/util/error.h"

namespace kuafu {

bool cuda_available() {
#ifdef KUAFU_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

torch::Device resolve_device(const std::string& spec, int local_rank, const std::string& key) {
  if (spec == "cpu") return torch::kCPU;
  if (spec == "auto") return cuda_available() ? torch::Device(torch::kCUDA, local_rank) : torch::Device(torch::kCPU);
  KUAFU_CHECK(spec.rfind("cuda", 0) == 0, key, " must be auto, cpu, cuda or cuda:N; found \"", spec, "\"");
  int index = local_rank;
  if (spec != "cuda") {
    const std::string digits = spec.size() > 5 && spec[4] == ':' ? spec.substr(5) : std::string();
    KUAFU_CHECK(!digits.empty() && digits.size() <= 4 && digits.find_first_not_of("0123456789") == std::string::npos,
                key, " must be auto, cpu, cuda or cuda:N with N a GPU number; found \"", spec, "\"");
    index = std::stoi(digits);
  }
  KUAFU_CHECK(cuda_available(), key, " = \"", spec, "\" but ",
              torch::cuda::is_available() ? "this build of Kuafu has no CUDA" : "no CUDA device is visible");
  const int count = static_cast<int>(torch::cuda::device_count());
  KUAFU_CHECK(index < count, key, " = \"", spec, "\" selects GPU ", index, " (", spec == "cuda" ? "the local rank" : "",
              ") but this machine shows ", count, " GPU(s); set CUDA_VISIBLE_DEVICES or ranks per node to match");
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(index)};
}

void select_device(const torch::Device& device) {
#ifdef KUAFU_WITH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

void synchronize(const torch::Device& device) {
#ifdef KUAFU_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
#else
  (void)device;
#endif
}

torch::Tensor to_device(const torch::Tensor& tensor, const torch::Device& device) {
  if (tensor.device() == device) return tensor;
  if (device.is_cuda() && tensor.is_cpu()) {
    return (tensor.is_pinned() ? tensor : tensor.pin_memory()).to(device, /*non_blocking=*/true);
  }
  return tensor.to(device);
}

torch::TensorOptions host_staging_options(const torch::Device& device) {
  return torch::TensorOptions().device(torch::kCPU).pinned_memory(device.is_cuda());
}

}  // namespace kuafu

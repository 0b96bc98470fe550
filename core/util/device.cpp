#include "core/util/device.h"

#include <torch/cuda.h>
#include <ATen/CPUGeneratorImpl.h>
#ifdef KUAFU_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
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
  if (spec == "auto" && !cuda_available()) return torch::kCPU;
  KUAFU_CHECK(spec == "auto" || spec.rfind("cuda", 0) == 0, key, " must be auto, cpu, cuda or cuda:N; found \"", spec,
              "\"");
  int index = local_rank;
  if (spec != "cuda" && spec != "auto") {
    const std::string digits = spec.size() > 5 && spec[4] == ':' ? spec.substr(5) : std::string();
    KUAFU_CHECK(!digits.empty() && digits.size() <= 4 && digits.find_first_not_of("0123456789") == std::string::npos,
                key, " must be auto, cpu, cuda or cuda:N with N a GPU number; found \"", spec, "\"");
    index = std::stoi(digits);
  }
  KUAFU_CHECK(cuda_available(), key, " = \"", spec, "\" but ",
              torch::cuda::is_available() ? "this build of Kuafu has no CUDA" : "no CUDA device is visible");
  const int count = static_cast<int>(torch::cuda::device_count());
  // More ranks on a node than GPUs would otherwise surface as CUDA's "invalid device ordinal" later.
  KUAFU_CHECK(index < count, key, " = \"", spec, "\" selects GPU ", index,
              spec == "cuda:" + std::to_string(index) ? "" : " (the local rank)", " but this machine shows ", count,
              " GPU(s); run at most that many ranks per node, set CUDA_VISIBLE_DEVICES, or set ", key, " = \"cpu\"");
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(index)};
}

std::optional<torch::Device> current_cuda_device() {
#ifdef KUAFU_WITH_CUDA
  if (cuda_available()) return torch::Device(torch::kCUDA, c10::cuda::current_device());
#endif
  return std::nullopt;
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

#ifdef KUAFU_WITH_CUDA
struct SideStreamMark {
  c10::cuda::CUDAEvent event;
};

struct SideStream::Stream {
  c10::cuda::CUDAStream stream;
};
#else
struct SideStreamMark {};
struct SideStream::Stream {};
#endif

SideStream::SideStream(const torch::Device& device) {
#ifdef KUAFU_WITH_CUDA
  if (device.is_cuda()) stream_.reset(new Stream{c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())});
#else
  (void)device;
#endif
}

SideStream::~SideStream() = default;

std::shared_ptr<SideStreamMark> SideStream::run(const std::function<void()>& work) {
  if (!stream_) {
    work();
    return nullptr;
  }
#ifdef KUAFU_WITH_CUDA
  // The side stream first waits for what the current stream has queued: the work may write memory that
  // the current stream's kernels still read (a chunk released and gathered again).
  c10::cuda::CUDAEvent queued;
  queued.record(c10::cuda::getCurrentCUDAStream(stream_->stream.device_index()));
  queued.block(stream_->stream);
  auto mark = std::make_shared<SideStreamMark>();
  {
    const c10::cuda::CUDAStreamGuard on_side(stream_->stream);
    work();
  }
  mark->event.record(stream_->stream);
  return mark;
#else
  return nullptr;
#endif
}

void SideStream::hand_over(const std::shared_ptr<SideStreamMark>& mark, const torch::Tensor& tensor) {
  if (!mark) return;
#ifdef KUAFU_WITH_CUDA
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(tensor.device().index());
  mark->event.block(current);
  c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), current);
#else
  (void)tensor;
#endif
}

namespace {

at::Generator default_generator(const torch::Device& device) {
#ifdef KUAFU_WITH_CUDA
  if (device.is_cuda()) return at::cuda::detail::getDefaultCUDAGenerator(device.index());
#endif
  KUAFU_CHECK(device.is_cpu(), "no random generator for device ", device.str(), " in this build");
  return at::detail::getDefaultCPUGenerator();
}

}  // namespace

torch::Tensor generator_state(const torch::Device& device) {
  at::Generator generator = default_generator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(const torch::Device& device, const torch::Tensor& state) {
  at::Generator generator = default_generator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

void rebind(torch::Tensor& tensor, const torch::Tensor& storage) {
  // Both are plain dense TensorImpls (meta included), so the shallow copy set_data would make is sound;
  // the autograd metadata (requires_grad, the gradient) stays with `tensor`.
  tensor.unsafeGetTensorImpl()->shallow_copy_from(storage.getIntrusivePtr());
}

}  // namespace kuafu

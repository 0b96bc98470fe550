// The one small place, beside core/dist/compat.h, that knows what differs between a CPU and a CUDA
// run outside communication: choosing the device, selecting it, waiting for it, host staging memory.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <torch/types.h>

namespace kuafu {

// True when this build has CUDA and a device is visible.
bool cuda_available();

// Parses runtime.device: "auto" (the local rank's GPU when CUDA is available, else the CPU), "cpu",
// "cuda" (the local rank's GPU) or "cuda:N". Throws kuafu::Error naming `key` for anything else, or
// for a GPU this machine does not have.
torch::Device resolve_device(const std::string& spec, int local_rank, const std::string& key = "runtime.device");

// The CUDA device this process works on (select_device's), or nullopt when CUDA is unavailable.
std::optional<torch::Device> current_cuda_device();

// Makes `device` the current CUDA device of this process (no-op on the CPU): NCCL and the caching
// allocator act on the current device.
void select_device(const torch::Device& device);

// Waits for the work queued on `device` (no-op on the CPU): timings and peaks must include it.
void synchronize(const torch::Device& device);

// `tensor` on `device`. From the CPU to a GPU the copy goes through page-locked memory and is queued
// asynchronously on the current stream; on the CPU it is `tensor` itself.
torch::Tensor to_device(const torch::Tensor& tensor, const torch::Device& device);

// Points `tensor` (and every handle to it, such as a module's member for its parameter) at `storage`:
// its data, shape, dtype and device. Tensor::set_data does the same but refuses to move between the meta
// device and a real one, which lazy construction does (train::materialize).
void rebind(torch::Tensor& tensor, const torch::Tensor& storage);

// Host tensors that will be copied to `device`: page-locked when it is a GPU (fast, asynchronous copies).
torch::TensorOptions host_staging_options(const torch::Device& device);

// The state of the default random generator of `device` (the CPU's, or that GPU's), and setting it
// back: replaying the same random draws (dropout masks) when a block's forward is recomputed.
torch::Tensor generator_state(const torch::Device& device);
void set_generator_state(const torch::Device& device, const torch::Tensor& state);

// Where work queued on a SideStream ends (CUDA: an event recorded after it).
struct SideStreamMark;

// A second queue of device work, so that copies (prefetching weights) overlap the compute queued on the
// current stream. CUDA: a stream from LibTorch's pool. CPU: the work simply runs at once.
class SideStream {
 public:
  explicit SideStream(const torch::Device& device);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  // Runs `work` with the side stream current: the kernels and copies it queues run there and the memory
  // it allocates belongs to it. Returns where that work ends (null on the CPU).
  std::shared_ptr<SideStreamMark> run(const std::function<void()>& work);

  // Before the current stream uses `tensor`, made by work that ends at `mark`: the current stream waits
  // for that work, and the allocator keeps the tensor's memory until the current stream is done with it
  // (it would otherwise reuse it once the side stream's own work ended). No-op for a null mark.
  static void hand_over(const std::shared_ptr<SideStreamMark>& mark, const torch::Tensor& tensor);

 private:
  struct Stream;
  std::unique_ptr<Stream> stream_;  // null on the CPU
};

}  // namespace kuafu

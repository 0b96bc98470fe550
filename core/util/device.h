// The one small place, beside core/dist/compat.h, that knows what differs between a CPU and a CUDA
// run outside communication: choosing the device, selecting it, waiting for it, host staging memory.
#pragma once

#include <string>

#include <torch/types.h>

namespace kuafu {

// True when this build has CUDA and a device is visible.
bool cuda_available();

// Parses runtime.device: "auto" (the local rank's GPU when CUDA is available, else the CPU), "cpu",
// "cuda" (the local rank's GPU) or "cuda:N". Throws kuafu::Error naming `key` for anything else, or
// for a GPU this machine does not have.
torch::Device resolve_device(const std::string& spec, int local_rank, const std::string& key = "runtime.device");

// Makes `device` the current CUDA device of this process (no-op on the CPU): NCCL and the caching
// allocator act on the current device.
void select_device(const torch::Device& device);

// Waits for the work queued on `device` (no-op on the CPU): timings and peaks must include it.
void synchronize(const torch::Device& device);

// `tensor` on `device`. From the CPU to a GPU the copy goes through page-locked memory and is queued
// asynchronously on the current stream; on the CPU it is `tensor` itself.
torch::Tensor to_device(const torch::Tensor& tensor, const torch::Device& device);

// Host tensors that will be copied to `device`: page-locked when it is a GPU (fast, asynchronous copies).
torch::TensorOptions host_staging_options(const torch::Device& device);

}  // namespace kuafu

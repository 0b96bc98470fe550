// Which of LibTorch's scaled-dot-product attention kernels may run (runtime.attention_backend) and which
// did (a benchmark's line names them). For each call LibTorch takes the first enabled kernel that accepts
// the inputs, in its priority order (LibTorch 2.11 on a GPU: flash, memory-efficient, the plain products,
// cuDNN, so cuDNN's runs only when named; on the CPU its flash kernel or the plain products). Naming one
// kernel enables it alone: a run then uses it or stops with an error that names the key. A process-wide
// choice, like LibTorch's own flags.
#pragma once

#include <string>
#include <vector>

#include <torch/types.h>

namespace kuafu::ops {

// "auto" (every kernel, LibTorch's order; Kuafu's own products where they were measured faster),
// "flash", "efficient", "cudnn" or "math".
void choose_attention_backend(const std::string& name);
const std::string& chosen_attention_backend();
const std::vector<std::string>& attention_backend_names();

// The kernel at::scaled_dot_product_attention would run for these inputs under the flags set now:
// "flash", "efficient", "cudnn", "math", or "none" where no enabled kernel takes them.
std::string libtorch_attention_kernel(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& mask, double dropout, bool causal);

// While on, ops::scaled_dot_product_attention notes the kernel of each call ("products" for Kuafu's own
// path): turning it on forgets what was noted before.
void record_attention_kernels(bool on);
bool recording_attention_kernels();
void note_attention_kernel(const std::string& name);
std::vector<std::string> attention_kernels_seen();  // sorted, each once

}  // namespace kuafu::ops

// Where a training step's time goes: a few steps under LibTorch's profiler (Kineto), summed per step
// by kind of work (matrix products, attention, normalisation, the loss, the optimizer, copies, GELU,
// other) and as the largest entries. On a GPU the entries are its kernels; on the CPU, the operators'
// own (self) time, so that nested operators count once. `benchmark.profile_steps` adds it to a
// benchmark's line; benchmarks/gpt_eager_pytorch.py's `profile` mode sorts PyTorch's step the same way.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace kuafu::train {

// {"source": "cuda kernels" | "cpu operators", "ms_per_step_by_kind": {...}, "top": [[name, ms], ...]}
nlohmann::json profile_steps(const std::function<void()>& step, int64_t steps, const torch::Device& device);

// The FLOPs LibTorch's profiler counts for `body`'s matrix products (aten::mm, addmm, bmm, baddbmm: 2 per
// multiply-add, on the operators' input shapes): an independent check of an app's analytic count.
double profiled_matmul_flops(const std::function<void()>& body);

// The kind of work a kernel or operator name belongs to (first match of a fixed table of name parts).
std::string kind_of_work(const std::string& name);

}  // namespace kuafu::train

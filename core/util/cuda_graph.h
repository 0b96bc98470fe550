// A step captured once as a CUDA graph and replayed: the launches of every kernel of a step (a decoding
// step, a whole training step) become one. What the step reads and writes must stay at the same
// addresses from one replay to the next (inputs copied into fixed tensors, state updated in place), and
// the step must not read a tensor's value on the host (.item(), a copy to the CPU): capture refuses it.
#pragma once

#include <functional>
#include <memory>

#include <torch/types.h>

namespace kuafu {

class CapturedStep {
 public:
  // `device`: a CUDA device; this build without CUDA refuses any.
  explicit CapturedStep(torch::Device device);
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // The first call: runs `step` once for real on a side stream (which also sets up what the first call of
  // each kernel does: cuBLAS handles and workspaces, optimizer state), then captures it there without
  // running it again; returns a copy of the real run's output. Later calls replay the capture on the current
  // stream and return its output tensor, overwritten by the next replay. `step` must do the same work every
  // time: the capture is of the second run, the real run's effects are the step's.
  torch::Tensor run(const std::function<torch::Tensor()>& step);

 private:
  struct Graph;  // the CUDA graph and its output (cuda_graph.cpp)
  torch::Device device_;
  std::unique_ptr<Graph> graph_;
};

}  // namespace kuafu

// Decoding steps of one token per row at fixed shapes: every layer's cache is a reserved buffer read
// whole, the real slots are a mask on the device, and each step's tokens, positions and slot are copied
// into the same input tensors. Nothing in a step then depends on a host value, so on a GPU the step is
// captured once as a CUDA graph and replayed per token, saving the launches of every kernel of every layer.
#pragma once

#include <memory>
#include <vector>

#include "core/nn/generation.h"
#include "core/util/cuda_graph.h"

namespace kuafu::nn {

class FixedShapeSteps {
 public:
  // `caches`: the layers' caches after the first (prompt) step, already reserved; `first`: that step, whose
  // key_padding (undefined: every token real) says which of the filled slots are real. `graphs`: capture
  // the step and replay it (CUDA decoders only; refused elsewhere).
  FixedShapeSteps(const Decoder& decoder, std::vector<ops::KVCache>& caches, const DecodeStep& first, bool graphs);
  ~FixedShapeSteps();
  // Logits [B, 1, V] of one new token per row (step.tokens [B, 1], step.positions [B, 1]; its key_padding is
  // not read: the new token is real in every row). Valid until the next call.
  torch::Tensor run(const DecodeStep& step);

 private:
  torch::Tensor body();  // the step on the fixed inputs

  const Decoder& decoder_;
  std::vector<ops::KVCache>& caches_;
  DecodeStep inputs_;  // tokens [B, 1], positions [B, 1], key_padding [B, capacity]: the real slots
  torch::Tensor slot_;  // int64 [1]: where the step's token goes in every cache
  int64_t filled_ = 0;  // slots written so far
  std::unique_ptr<CapturedStep> graph_;  // with `graphs`: captured at the first step, replayed after
};

}  // namespace kuafu::nn

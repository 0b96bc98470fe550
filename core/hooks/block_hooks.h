// The block-call interface: the C++ stand-in for Python's forward and backward hooks. A model runs each
// of its blocks through run_block, naming the modules the block computes with; a strategy installed on
// the model (Gemini's chunk gathering, later activation checkpointing) acts before and after the
// block's forward and its backward. No model mentions a strategy, only this interface.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

namespace kuafu::hooks {

// One block as a strategy sees it.
struct BlockCall {
  std::string name;                           // e.g. "transformer.h.3"; stable across steps
  std::vector<const torch::nn::Module*> modules;  // their parameters are what the block computes with
};

class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void pre_forward(const BlockCall& call) = 0;
  virtual void post_forward(const BlockCall& call) = 0;
  // Before any of the block's backward runs, and after the gradient w.r.t. its input is computed.
  virtual void pre_backward(const BlockCall& call) = 0;
  virtual void post_backward(const BlockCall& call) = 0;
};

// body(input) between hooks->pre_forward and post_forward (just body(input) when hooks is null). When
// gradients flow, the block's backward is bracketed too: pre_backward runs when the gradient of the
// block's output arrives, post_backward once the gradient of `input` is complete (an input that needs no
// gradient, such as token ids, gets no post_backward: the strategy settles such blocks at the end).
torch::Tensor run_block(BlockHooks* hooks, const BlockCall& call, const torch::Tensor& input,
                        const std::function<torch::Tensor(const torch::Tensor&)>& body);

}  // namespace kuafu::hooks

// The block-call interface: the C++ stand-in for Python's forward and backward hooks. A model runs each
// of its blocks through run_block (usually through hooks::BlockSites), naming the modules the block
// computes with; a strategy installed on the model (Gemini's chunk gathering, frozen-weight offload)
// acts before and after the block's forward and its backward. No model mentions a strategy, only this
// interface. A block may take and return several tensors (a UNet block's stream, timestep embedding and
// context; an Evoformer block's MSA and pair streams).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

namespace kuafu::hooks {

// What a block takes or returns, in an order the block defines. An undefined tensor is an absent
// optional input (no mask, say); non-floating tensors (token ids) pass as they are.
using Tensors = std::vector<torch::Tensor>;
using BlockBody = std::function<Tensors(const Tensors&)>;
using TensorBody = std::function<torch::Tensor(const torch::Tensor&)>;

// True for a tensor whose gradient autograd computes (an absent one needs none).
inline bool needs_grad(const torch::Tensor& t) { return t.defined() && t.requires_grad(); }

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
  // Before any of the block's backward runs, and after the gradients w.r.t. its inputs are computed.
  virtual void pre_backward(const BlockCall& call) = 0;
  virtual void post_backward(const BlockCall& call) = 0;
  // After each of several backward passes whose gradients add up to one step while forwards run between
  // them (a pipeline stage's micro-batches): a strategy that reduces gradients inside a backward settles
  // the pass's here, before the next pass's gradients arrive.
  virtual void end_backward_pass() {}
};

// body(inputs) between hooks->pre_forward and post_forward (just body(inputs) when hooks is null). When
// gradients flow, the block's backward is bracketed too: pre_backward runs once, when the gradients of
// all its outputs have arrived; post_backward once, when those of all its inputs are complete (a block
// none of whose inputs needs a gradient, such as one reading token ids, gets no post_backward: the
// strategy settles such blocks at the end).
Tensors run_block(BlockHooks* hooks, const BlockCall& call, const Tensors& inputs, const BlockBody& body);
// The one-tensor form.
torch::Tensor run_block(BlockHooks* hooks, const BlockCall& call, const torch::Tensor& input, const TensorBody& body);

// Wraps a one-tensor body as a block body (one input, one output).
BlockBody as_block_body(TensorBody body);

}  // namespace kuafu::hooks

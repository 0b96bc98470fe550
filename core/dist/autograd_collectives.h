// Collectives as autograd functions: each forward communicates and its backward is the matching
// collective on the gradient, so distributed layers differentiate like their serial twins.
#pragma once

#include "core/dist/process_group.h"

namespace kuafu::dist::autograd {

// Exact gradients for a loss summed over the ranks' losses (L = Σ_r L_r):
torch::Tensor all_reduce_sum(const torch::Tensor& x, GroupPtr group);      // bwd: all-reduce sum
torch::Tensor all_gather(const torch::Tensor& x, GroupPtr group, int64_t dim);   // bwd: reduce-scatter
torch::Tensor reduce_scatter(const torch::Tensor& x, GroupPtr group, int64_t dim);  // bwd: all-gather
torch::Tensor all_to_all(const torch::Tensor& x, GroupPtr group, int64_t split_dim,
                         int64_t concat_dim);                                // bwd: the inverse all-to-all
torch::Tensor broadcast(const torch::Tensor& x, GroupPtr group, int root);  // bwd: sum to root

// Megatron's conjugate pair for tensor-parallel regions, where the loss is computed redundantly on
// every rank from replicated activations (so a replicated gradient must be counted once):
torch::Tensor copy_to_group(const torch::Tensor& x, GroupPtr group);      // fwd identity, bwd all-reduce
torch::Tensor reduce_from_group(const torch::Tensor& x, GroupPtr group);  // fwd all-reduce, bwd identity

// Point to point. send returns a scalar token: calling backward on it receives the gradient of `x`
// from `peer`. recv's result requires grad; its backward sends the gradient back to `peer`.
torch::Tensor send(const torch::Tensor& x, GroupPtr group, int peer);
torch::Tensor recv(at::IntArrayRef shape, const torch::TensorOptions& options, GroupPtr group, int peer);

}  // namespace kuafu::dist::autograd

// The global gradient norm of a model whose parameters may be split over ranks (data-parallel ZeRO
// shards, tensor-parallel shards, pipeline stages), and clipping by it. Each rank adds the squares of
// the gradient pieces it counts (Param::counts_in_global_norm) and one all-reduce over `across`
// (the group spanning every rank that holds different pieces) completes the sum: nothing is counted twice.
#pragma once

#include <vector>

#include "core/optim/optimizer.h"

namespace kuafu::optim {

// The L2 norm of every counted gradient; `across` null = all gradients are here (plain data parallel).
// Parameters without a gradient contribute nothing. Non-finite gradients give a non-finite norm.
// `known[i]`, where given and defined, is params[i]'s squared_norm() already taken (a gradient on Gemini's
// disk tier, measured as it was written): the sum is the same either way.
double global_grad_norm(const std::vector<Param>& params, const dist::GroupPtr& across,
                        const std::vector<torch::Tensor>& known = {});
// The same norm as [1] float64 where the gradients live (the group's device when summed over it), nothing
// read on the host: what a step captured as a CUDA graph computes.
torch::Tensor global_grad_norm_tensor(const std::vector<Param>& params, const dist::GroupPtr& across,
                                      const std::vector<torch::Tensor>& known = {});

// min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_; 1 when max_norm <= 0 (no clipping).
double clip_coefficient(double norm, double max_norm);
// The same of a norm tensor, elementwise: the same IEEE operations, so the same value as the host's.
torch::Tensor clip_coefficient(const torch::Tensor& norm, double max_norm);
// Multiplies every gradient by `factor` (nothing when it is 1).
void scale_grads(const std::vector<Param>& params, double factor);

// Scales the gradients by clip_coefficient(norm, max_norm) and returns the norm before clipping.
// A non-finite norm leaves the gradients untouched (the caller skips the step or stops).
double clip_grad_norm(const std::vector<Param>& params, double max_norm, const dist::GroupPtr& across);

}  // namespace kuafu::optim

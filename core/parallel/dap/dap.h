// Dynamic axial parallelism (FastFold): AlphaFold's MSA [B, S, R, C] and pair [B, R, R, C] tensors are
// cut along one axis across the DAP group, so attention along the other axis runs locally; an
// all-to-all moves the cut to the other axis between row-wise and column-wise steps.
//
// Gradients are exact for a loss summed over the ranks' contributions: a tensor whole on every rank
// carries its whole gradient, a cut one its block's whole gradient. Parameters used on cut tensors
// receive this rank's share of their gradient and must be summed over the group (as data parallelism
// does). Every primitive divides its dimension evenly; other sizes are refused with both numbers.
#pragma once

#include <ATen/core/ivalue.h>

#include "core/dist/process_group.h"

namespace kuafu::parallel::dap {

// Whole on every rank -> this rank's block along `dim`. Backward: all-gather of the blocks' gradients.
torch::Tensor split(const torch::Tensor& x, dist::GroupPtr group, int64_t dim);

// Whole on every rank -> this rank's block along `dim`, for ranks that each compute the same loss from it:
// backward passes back this block's gradient only (zeros elsewhere: a plain narrow, no transfer).
torch::Tensor local_block(const torch::Tensor& x, const dist::ProcessGroup& group, int64_t dim);

// Blocks -> the whole tensor on every rank, each rank going on with its own part of the computation
// (e.g. its rows of a triangle update against every row). Backward: reduce-scatter, which sums every
// rank's use of each block (FastFold's gather keeps only the local gradient, dropping the others').
torch::Tensor gather(const torch::Tensor& x, dist::GroupPtr group, int64_t dim);

// Cut along `from_dim` -> cut along `to_dim` (all-to-all). Backward: the inverse all-to-all.
torch::Tensor move_cut(const torch::Tensor& x, dist::GroupPtr group, int64_t from_dim, int64_t to_dim);
// For [B, R, R, C] / [B, S, R, C]: rows cut (dim 1) -> columns cut (dim 2), and back.
inline torch::Tensor row_to_col(const torch::Tensor& x, dist::GroupPtr group) { return move_cut(x, group, 1, 2); }
inline torch::Tensor col_to_row(const torch::Tensor& x, dist::GroupPtr group) { return move_cut(x, group, 2, 1); }

struct AsyncState;  // the transfers in flight, shared by the two halves of an asynchronous primitive

// The asynchronous forms: the call posts the transfer and returns at once; wait() returns what the
// synchronous form would. Work between the two overlaps the transfer in forward, and in backward the
// gradient's transfer (started when the engine reaches wait's backward) overlaps the same work's
// backward. Gradients are those of the synchronous forms.
class Pending {
 public:
  Pending(torch::Tensor token, c10::intrusive_ptr<AsyncState> state);
  Pending(Pending&&) noexcept;
  Pending& operator=(Pending&&) noexcept;
  ~Pending();
  torch::Tensor wait();  // once

 private:
  torch::Tensor token_;  // links the two halves in the autograd graph
  c10::intrusive_ptr<AsyncState> state_;
};
Pending gather_async(const torch::Tensor& x, dist::GroupPtr group, int64_t dim);
Pending move_cut_async(const torch::Tensor& x, dist::GroupPtr group, int64_t from_dim, int64_t to_dim);

}  // namespace kuafu::parallel::dap

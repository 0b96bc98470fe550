// Where a model's axial tensors lie (AlphaFold's MSA [S, R, c] and pair [R, R, c]): whole on one process,
// or cut into equal blocks across a DAP group. Model maths written against it runs serially (every call
// is the identity) and under dynamic axial parallelism without change; the maths says which axis each of
// its steps needs whole, the layout moves the data.
//
// Gradients: every rank computes the same loss from tensors gathered whole at the end, and the trainer
// averages gradients over the group (data x dap), so each rank's gradients are those of the sum of the
// ranks' losses: `mine` (taking this rank's block of a tensor every rank holds whole) passes back only
// its block's gradient, `whole` sums every rank's gradient of the gathered tensor (reduce-scatter), and
// `move` is the inverse all-to-all.
#pragma once

#include <optional>

#include "core/parallel/dap/dap.h"

namespace kuafu::parallel::dap {

class AxialLayout {
 public:
  AxialLayout() = default;  // serial
  explicit AxialLayout(dist::GroupPtr group);  // null or a group of one: serial

  bool serial() const { return !group_; }
  int64_t parts() const { return group_ ? group_->size() : 1; }
  const dist::GroupPtr& group() const { return group_; }

  // This rank's block of `x` along `dim` (x whole on every rank; its size must divide by parts()).
  torch::Tensor mine(const torch::Tensor& x, int64_t dim) const;
  // The whole tensor from every rank's block along `dim`.
  torch::Tensor whole(const torch::Tensor& x, int64_t dim) const;
  // Cut along `from` -> cut along `to`.
  torch::Tensor move(const torch::Tensor& x, int64_t from, int64_t to) const;

  // move's asynchronous form: work between the call and wait() overlaps the transfer (and in backward the
  // gradient's transfer overlaps that work's backward).
  class Moving {
   public:
    explicit Moving(torch::Tensor ready) : ready_(std::move(ready)) {}
    explicit Moving(Pending pending) : pending_(std::move(pending)) {}
    torch::Tensor wait() { return pending_ ? pending_->wait() : ready_; }

   private:
    torch::Tensor ready_;
    std::optional<Pending> pending_;
  };
  Moving move_async(const torch::Tensor& x, int64_t from, int64_t to) const;

 private:
  dist::GroupPtr group_;
};

}  // namespace kuafu::parallel::dap

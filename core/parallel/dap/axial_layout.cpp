#include "core/parallel/dap/axial_layout.h"

#include "core/util/error.h"

namespace kuafu::parallel::dap {

AxialLayout::AxialLayout(dist::GroupPtr group) {
  if (group && !group->trivial()) group_ = std::move(group);
}

torch::Tensor AxialLayout::mine(const torch::Tensor& x, int64_t dim) const {
  if (!group_) return x;
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  KUAFU_CHECK(d >= 0 && d < x.dim(), "dap: dim ", dim, " is out of range for a tensor of ", x.dim(), " dims");
  KUAFU_CHECK(x.size(d) % parts() == 0, "dap: dim ", d, " has size ", x.size(d), ", which does not divide by the DAP group size ",
              parts(), "; pad it to a multiple of ", parts());
  const int64_t block = x.size(d) / parts();
  // A plain narrow: its backward pads this rank's gradient with zeros (the other blocks are other ranks').
  return x.narrow(d, group_->rank() * block, block);
}

torch::Tensor AxialLayout::whole(const torch::Tensor& x, int64_t dim) const { return group_ ? gather(x, group_, dim) : x; }

torch::Tensor AxialLayout::move(const torch::Tensor& x, int64_t from, int64_t to) const {
  return group_ ? move_cut(x, group_, from, to) : x;
}

AxialLayout::Moving AxialLayout::move_async(const torch::Tensor& x, int64_t from, int64_t to) const {
  return group_ ? Moving(move_cut_async(x, group_, from, to)) : Moving(x);
}

}  // namespace kuafu::parallel::dap

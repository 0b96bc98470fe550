#include "core/parallel/dap/axial_layout.h"

namespace kuafu::parallel::dap {

AxialLayout::AxialLayout(dist::GroupPtr group) {
  if (group && !group->trivial()) group_ = std::move(group);
}

torch::Tensor AxialLayout::mine(const torch::Tensor& x, int64_t dim) const { return group_ ? local_block(x, *group_, dim) : x; }

torch::Tensor AxialLayout::whole(const torch::Tensor& x, int64_t dim) const { return group_ ? gather(x, group_, dim) : x; }

torch::Tensor AxialLayout::move(const torch::Tensor& x, int64_t from, int64_t to) const {
  return group_ ? move_cut(x, group_, from, to) : x;
}

AxialLayout::Moving AxialLayout::move_async(const torch::Tensor& x, int64_t from, int64_t to) const {
  return group_ ? Moving(move_cut_async(x, group_, from, to)) : Moving(x);
}

}  // namespace kuafu::parallel::dap

#include "core/parallel/tensor/layout.h"

#include <algorithm>

#include "core/dist/collectives.h"
#include "core/util/error.h"

namespace kuafu::parallel {
namespace {

// The split's axes in mesh order: blocks are numbered with the mesh's first axis outermost, which is
// also the rank order of mesh.group(axes).
std::vector<std::string> in_mesh_order(const std::vector<std::string>& axes, const dist::ProcessMesh& mesh) {
  std::vector<std::string> ordered;
  for (const auto& axis : mesh.axes()) {
    if (std::find(axes.begin(), axes.end(), axis.name) != axes.end()) ordered.push_back(axis.name);
  }
  KUAFU_CHECK(ordered.size() == axes.size(), "tensor layout names an axis the mesh lacks: ", mesh.describe());
  return ordered;
}

struct Blocks {
  int64_t count = 1;  // ranks the dimension is cut across
  int64_t index = 0;  // this rank's block
};

Blocks blocks_of(const DimSplit& split, const dist::ProcessMesh& mesh) {
  Blocks b;
  for (const auto& axis : in_mesh_order(split.axes, mesh)) {
    b.index = b.index * mesh.size(axis) + mesh.coordinate(axis);
    b.count *= mesh.size(axis);
  }
  return b;
}

// `t` with dimension `dim` viewed as [stride, rest] (a view: no copy).
torch::Tensor segmented(const torch::Tensor& t, int64_t dim, int64_t stride) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape[static_cast<size_t>(dim)] /= stride;
  shape.insert(shape.begin() + dim, stride);
  return t.reshape(shape);
}

torch::Tensor merged(const torch::Tensor& t, int64_t dim) { return t.flatten(dim, dim + 1); }

}  // namespace

torch::Tensor shard_of(const torch::Tensor& full, const Layout& layout, const dist::ProcessMesh& mesh) {
  torch::Tensor t = full;
  for (const auto& split : layout) {
    const Blocks b = blocks_of(split, mesh);
    const int64_t size = t.size(split.dim);
    KUAFU_CHECK(size % (split.stride * b.count) == 0, "dimension ", split.dim, " of size ", size,
                " cannot be cut into ", split.stride, " x ", b.count, " equal blocks (tensor-parallel size must divide it)");
    const int64_t block = size / split.stride / b.count;
    t = merged(segmented(t, split.dim, split.stride).narrow(split.dim + 1, b.index * block, block), split.dim);
  }
  return t.contiguous().clone();
}

std::vector<BlockCut> block_cuts(const Layout& layout, const dist::ProcessMesh& mesh) {
  std::vector<BlockCut> cuts;
  for (const auto& split : layout) {
    const Blocks b = blocks_of(split, mesh);
    cuts.push_back({split.dim, split.stride, b.count, b.index});
  }
  return cuts;
}

torch::Tensor gather_full(const torch::Tensor& shard, const Layout& layout, const dist::ProcessMesh& mesh) {
  torch::Tensor t = shard.contiguous();
  for (auto split = layout.rbegin(); split != layout.rend(); ++split) {
    const auto group = mesh.group(in_mesh_order(split->axes, mesh));
    torch::Tensor pieces = segmented(t, split->dim, split->stride).contiguous();
    t = merged(dist::all_gather(pieces, *group, split->dim + 1), split->dim).contiguous();
  }
  return t;
}

dist::GroupPtr shard_group(const Layout& layout, const dist::ProcessMesh& mesh,
                           const std::vector<std::string>& pieces_over) {
  std::vector<std::string> axes;
  for (const auto& split : layout) axes.insert(axes.end(), split.axes.begin(), split.axes.end());
  if (axes.empty()) return nullptr;
  axes.insert(axes.end(), pieces_over.begin(), pieces_over.end());
  return mesh.group(in_mesh_order(axes, mesh));
}

bool counts_in_global_norm(const Layout& layout, const std::vector<std::string>& tensor_axes,
                           const dist::ProcessMesh& mesh) {
  for (const auto& axis : tensor_axes) {
    const bool split = std::any_of(layout.begin(), layout.end(), [&](const DimSplit& s) {
      return std::find(s.axes.begin(), s.axes.end(), axis) != s.axes.end();
    });
    if (!split && mesh.coordinate(axis) != 0) return false;
  }
  return true;
}

std::map<std::string, Layout> collect_layouts(const torch::nn::Module& model) {
  std::map<std::string, Layout> out;
  auto add = [&](const torch::nn::Module& module, const std::string& prefix) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(&module);
    if (!sharded) return;
    for (const auto& [name, layout] : sharded->parameter_layouts()) out[prefix.empty() ? name : prefix + "." + name] = layout;
  };
  add(model, "");
  // include_self = false: the root may not be held by a shared_ptr.
  for (const auto& item : model.named_modules("", /*include_self=*/false)) add(*item.value(), item.key());
  return out;
}

}  // namespace kuafu::parallel

// How a tensor-parallel parameter is cut over the mesh: which dimensions are split across which axes.
// From that one description come the local block of a full tensor (initialisation, loading a serial
// checkpoint), the full tensor from the blocks (saving), and the optimizer's shard group and
// global-norm counting (core/optim/optimizer.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/dist/process_mesh.h"

namespace kuafu::parallel {

// Dimension `dim` is cut into equal blocks across `axes` (the first axis outermost). With stride s the
// dimension is s equal segments (e.g. q|k|v) and each segment is cut the same way, so a rank holds its
// block of every segment (Megatron's strided split of the fused QKV projection).
struct DimSplit {
  int64_t dim = 0;
  std::vector<std::string> axes;
  int64_t stride = 1;
};
using Layout = std::vector<DimSplit>;  // empty: the whole tensor on every rank

// Where this rank's block lies along one cut dimension: the dimension is `stride` segments, each cut
// into `count` equal blocks, and the rank holds block `index` of every segment.
struct BlockCut {
  int64_t dim = 0;
  int64_t stride = 1;
  int64_t count = 1;
  int64_t index = 0;
};
// This rank's block of a tensor of `layout`, as cuts (one per split dimension; none for a whole tensor).
std::vector<BlockCut> block_cuts(const Layout& layout, const dist::ProcessMesh& mesh);

// This rank's block of `full` (a copy). kuafu::Error when a split dimension does not divide.
torch::Tensor shard_of(const torch::Tensor& full, const Layout& layout, const dist::ProcessMesh& mesh);

// The full tensor assembled from every rank's block: collective over the split axes (every rank of
// those groups must call it, in the same order).
torch::Tensor gather_full(const torch::Tensor& shard, const Layout& layout, const dist::ProcessMesh& mesh);

// The ranks holding different blocks of the parameter (every axis the layout splits), or null. With
// `pieces_over` (the data axes ZeRO and Gemini cut each block over), the ranks holding its pieces: null
// when the layout splits nothing (the pieces' own group serves).
dist::GroupPtr shard_group(const Layout& layout, const dist::ProcessMesh& mesh,
                           const std::vector<std::string>& pieces_over = {});

// True on the one rank of each set of replicas: coordinate 0 along every axis of `tensor_axes` that
// the layout does not split. Such a rank counts the parameter in the global gradient norm.
bool counts_in_global_norm(const Layout& layout, const std::vector<std::string>& tensor_axes,
                           const dist::ProcessMesh& mesh);

// A module holding sharded parameters says how each (by its local name) is laid out.
// Where tensor-parallel layers create their parameters: the device of the mesh's processes.
inline torch::TensorOptions parameter_options(const dist::ProcessMesh& mesh) {
  return torch::TensorOptions().device(mesh.world().device());
}

class ShardedModule {
 public:
  virtual ~ShardedModule() = default;
  virtual std::map<std::string, Layout> parameter_layouts() const = 0;
};

// Layouts of every sharded parameter of `model` under its full name (e.g. "h.0.attn.c_attn.weight").
std::map<std::string, Layout> collect_layouts(const torch::nn::Module& model);

}  // namespace kuafu::parallel

#include "core/parallel/tensor/tensor_parallel.h"

#include <cmath>

namespace kuafu::parallel {
namespace {

// The integer r with r^power == n, or 0.
int exact_root(int n, int power) {
  const int r = static_cast<int>(std::lround(std::pow(static_cast<double>(n), 1.0 / power)));
  int product = 1;
  for (int i = 0; i < power; ++i) product *= r;
  return product == n ? r : 0;
}

}  // namespace

void add_tensor_parallel_schema(config::Schema& s) {
  s.add_string("parallel.tensor.mode", "none", "tensor parallelism: none, 1d, 2d (SUMMA), 2.5d (Tesseract), 3d")
      .choices({"none", "1d", "2d", "2.5d", "3d"});
  s.add_int("parallel.tensor.size", 1, "ranks per tensor-parallel group: any for 1d, q^2 for 2d, d q^2 for 2.5d, "
                                       "q^3 for 3d").min(1);
  s.add_int("parallel.tensor.depth", 1, "2.5d: number of stacked q x q grids (d)").min(1);
}

TensorParallelSpec tensor_parallel_spec(const config::Config& config) {
  TensorParallelSpec spec;
  const std::string mode = config.get_string("parallel.tensor.mode");
  spec.size = static_cast<int>(config.get_int("parallel.tensor.size"));
  spec.depth = static_cast<int>(config.get_int("parallel.tensor.depth"));
  const std::string size = std::to_string(spec.size);
  if (mode == "none") {
    if (spec.size != 1) config.fail_at("parallel.tensor.size", "is " + size + " but parallel.tensor.mode is \"none\"");
    return spec;
  }
  if (mode == "1d") {
    spec.mode = TensorMode::k1D;
  } else if (mode == "2d") {
    spec.mode = TensorMode::k2D;
    if (!exact_root(spec.size, 2)) {
      config.fail_at("parallel.tensor.size", "is " + size + " but 2d needs a square number of ranks (4, 9, 16, ...)");
    }
  } else if (mode == "2.5d") {
    spec.mode = TensorMode::k2p5D;
    if (spec.size % spec.depth != 0 || !exact_root(spec.size / spec.depth, 2)) {
      config.fail_at("parallel.tensor.size", "is " + size + " but 2.5d needs depth x q^2 ranks with parallel.tensor.depth = " +
                                                 std::to_string(spec.depth) + " (e.g. " +
                                                 std::to_string(4 * spec.depth) + " for q = 2)");
    }
  } else {
    spec.mode = TensorMode::k3D;
    if (!exact_root(spec.size, 3)) {
      config.fail_at("parallel.tensor.size", "is " + size + " but 3d needs a cube number of ranks (8, 27, 64, ...)");
    }
  }
  if (spec.mode != TensorMode::k2p5D && spec.depth != 1) {
    config.fail_at("parallel.tensor.depth", "applies to mode \"2.5d\" only");
  }
  return spec;
}

std::string mode_name(TensorMode mode) {
  switch (mode) {
    case TensorMode::kNone: return "none";
    case TensorMode::k1D: return "1d";
    case TensorMode::k2D: return "2d";
    case TensorMode::k2p5D: return "2.5d";
    case TensorMode::k3D: return "3d";
  }
  return "?";
}

int grid_side(const TensorParallelSpec& spec) {
  switch (spec.mode) {
    case TensorMode::kNone: return 1;
    case TensorMode::k1D: return spec.size;
    case TensorMode::k2D: return exact_root(spec.size, 2);
    case TensorMode::k2p5D: return exact_root(spec.size / spec.depth, 2);
    case TensorMode::k3D: return exact_root(spec.size, 3);
  }
  return 1;
}

std::vector<dist::MeshAxis> tensor_mesh_axes(const TensorParallelSpec& spec) {
  const int q = grid_side(spec);
  switch (spec.mode) {
    case TensorMode::kNone: return {};
    case TensorMode::k1D: return {{"tensor", spec.size}};
    case TensorMode::k2D: return {{"tp_row", q}, {"tp_col", q}};
    case TensorMode::k2p5D: return {{"tp_dep", spec.depth}, {"tp_row", q}, {"tp_col", q}};
    case TensorMode::k3D: return {{"tp_x", q}, {"tp_y", q}, {"tp_z", q}};
  }
  return {};
}

std::vector<std::string> tensor_axis_names(const TensorParallelSpec& spec) {
  std::vector<std::string> names;
  for (const auto& axis : tensor_mesh_axes(spec)) names.push_back(axis.name);
  return names;
}

}  // namespace kuafu::parallel

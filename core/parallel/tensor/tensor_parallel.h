// Tensor-parallel modes and their mesh axes. 1D cuts layers over one axis of P ranks (Megatron); 2D
// lays P = q x q ranks on a grid (SUMMA); 2.5D stacks d such grids, P = d q^2 (Tesseract); 3D uses a
// q x q x q cube. The axes follow "data" in the ProcessMesh.
#pragma once

#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/dist/process_mesh.h"

namespace kuafu::parallel {

enum class TensorMode { kNone, k1D, k2D, k2p5D, k3D };

struct TensorParallelSpec {
  TensorMode mode = TensorMode::kNone;
  int size = 1;   // ranks per tensor-parallel group, P
  int depth = 1;  // 2.5D: number of stacked q x q grids, d
};

// parallel.tensor.mode, parallel.tensor.size, parallel.tensor.depth.
void add_tensor_parallel_schema(config::Schema& schema);

// The configured spec; a size that the mode cannot lay out (P not a square, a cube, or d q^2) fails at
// the key with the sizes that would work.
TensorParallelSpec tensor_parallel_spec(const config::Config& config);

// The mesh axes of a spec, outermost first: 1D {tensor}; 2D {tp_row, tp_col}; 2.5D {tp_dep, tp_row,
// tp_col}; 3D {tp_x, tp_y, tp_z}. Empty for kNone.
std::vector<dist::MeshAxis> tensor_mesh_axes(const TensorParallelSpec& spec);
std::vector<std::string> tensor_axis_names(const TensorParallelSpec& spec);

// "none", "1d", "2d", "2.5d" or "3d": the config's name of a mode.
std::string mode_name(TensorMode mode);

// The grid side q of a 2D, 2.5D or 3D spec (P for 1D).
int grid_side(const TensorParallelSpec& spec);

}  // namespace kuafu::parallel

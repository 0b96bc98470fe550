// Reading one piece of a tensor from other pieces of it (checkpoint_shards.h) while touching only the
// bytes they share: a tensor-parallel block of a whole tensor in a Hugging Face file, or a ZeRO piece of
// a 2D block from the 1D blocks another layout saved. A piece (a run of elements of a block) is a few
// boxes of its block, each box a set of boxes of the whole tensor (one per stride segment of a cut
// dimension); two pieces share the intersections of those boxes, and each intersection is read as a box
// of the saved piece's file (io::read_box: one read per run of consecutive elements).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/train/checkpoint_shards.h"

namespace kuafu::train {

// A saved piece of `numel` elements at `place`. `read_box(first, shape, begin, size)`: the box [begin,
// begin + size) of its elements [first, first + prod(shape)) viewed as an array of `shape` (a tensor of
// `size`); `where` names its file in messages.
struct SavedPiece {
  PiecePlace place;
  int64_t numel = 0;
  std::function<torch::Tensor(int64_t first, const std::vector<int64_t>& shape, const std::vector<int64_t>& begin,
                              const std::vector<int64_t>& size)>
      read_box;
  std::string where;
};

// A saved piece read from tensor `entry` of a safetensors file.
SavedPiece piece_in_file(const io::SafetensorsIndex& file, const io::SafetensorsEntry& entry, PiecePlace place);

// Elements [wanted.offset, wanted.offset + numel) of the block `wanted` names (1-D, of `dtype`) from
// `saved`, pieces of the same whole tensor, each read only where it overlaps what is wanted. kuafu::Error
// naming `name`, and the saved piece's file for two pieces that overlap there, or `where` for elements no
// piece holds.
torch::Tensor assemble_piece(const std::string& name, const PiecePlace& wanted, int64_t numel,
                             const std::vector<SavedPiece>& saved, torch::ScalarType dtype, const std::string& where);

// This rank's block (`cuts`) of tensor `entry` of `file`, in the block's shape, reading only its bytes.
torch::Tensor read_block(const io::SafetensorsIndex& file, const io::SafetensorsEntry& entry,
                         const std::vector<parallel::BlockCut>& cuts);

}  // namespace kuafu::train

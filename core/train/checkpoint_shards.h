// Sharded checkpoints: each rank writes only the pieces of tensors it owns (its ZeRO/Gemini piece, its
// tensor-parallel block, its pipeline stage's tensors), with where each piece lies in the whole tensor;
// a reader of any layout rebuilds whole tensors one at a time from the pieces that make them up.
//
// Files of one part ("" for an app's one model) and kind ("model", "optimizer") in a checkpoint folder:
//   <part>.<kind>.safetensors          whole tensors, written by one rank (one process, or a frozen model)
//   <part>.<kind>.rank<r>.safetensors  rank r's pieces; the metadata entry "kuafu.pieces" holds their places
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "core/parallel/tensor/layout.h"

namespace kuafu::train {

// Where a piece lies in its whole tensor: the tensor-parallel block `cuts` name (none: the whole tensor),
// then the block's elements (flattened, row-major) from `offset` on, as many as the piece holds.
struct PiecePlace {
  std::vector<int64_t> shape;  // the whole tensor's
  std::vector<parallel::BlockCut> cuts;
  int64_t offset = 0;
};

struct TensorPiece {
  std::string name;
  torch::Tensor data;  // numel() elements of the block from place.offset, in any shape, on any device
  PiecePlace place;
};

// A piece that is all of `tensor`.
TensorPiece whole_piece(std::string name, torch::Tensor tensor);
// The shape of the block `place.cuts` name.
std::vector<int64_t> block_shape(const PiecePlace& place);
// True when a piece of `numel` elements at `place` is the whole tensor.
bool is_whole(const PiecePlace& place, int64_t numel);

nlohmann::json place_to_json(const PiecePlace& place);
// kuafu::Error naming `where` for anything but a place a writer could have made.
PiecePlace place_from_json(const nlohmann::json& json, const std::string& where);

// The `numel` elements of `whole` at `place`, as a 1-D copy: a piece cut in memory (what saving a rank's
// piece and piece_reader.h's reads from files must agree with).
torch::Tensor read_piece(const torch::Tensor& whole, const PiecePlace& place, int64_t numel);

// File names of a part's kind.
std::string whole_file_name(const std::string& part, const std::string& kind);
std::string shard_file_name(const std::string& part, const std::string& kind, int rank);
inline constexpr const char* kPiecesKey = "kuafu.pieces";

// Writes this rank's pieces as its shard file; returns its size and CRC-32. `before_write`: as io::save_safetensors.
FileSum save_pieces(const std::string& path, const std::vector<TensorPiece>& pieces,
                    std::map<std::string, std::string> metadata,
                    const std::function<void(const torch::Tensor&)>& before_write = nullptr);

struct SavedPiece;  // piece_reader.h

// One kind of one part of a checkpoint, whole or sharded: whole tensors by name, each read when asked
// from the pieces that make it up (only their bytes), checked to cover every element exactly once.
class SavedTensors {
 public:
  // kuafu::Error naming the folder when it holds neither form of the files.
  SavedTensors(const std::string& folder, const std::string& part, const std::string& kind);
  static bool exists(const std::string& folder, const std::string& part, const std::string& kind);

  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return pieces_.count(name) > 0; }
  torch::Tensor read(const std::string& name) const;
  // Only `numel` elements of the block `place` names (1-D): a tensor-parallel block, a ZeRO/Gemini piece
  // or both, whatever layout saved it. Only the bytes of the saved pieces it overlaps are read
  // (piece_reader.h).
  torch::Tensor read_piece(const std::string& name, const PiecePlace& place, int64_t numel) const;
  // The whole tensor's shape and dtype, without reading it.
  std::vector<int64_t> shape(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The file (or the shard files' pattern) for messages.
  const std::string& where() const { return where_; }
  bool sharded() const { return sharded_; }

 private:
  struct Source {
    size_t file = 0;   // in files_
    size_t entry = 0;  // in that file's entries
    PiecePlace place;
  };
  const std::vector<Source>& sources(const std::string& name) const;
  std::vector<SavedPiece> saved_pieces(const std::vector<Source>& list) const;

  std::vector<io::SafetensorsIndex> files_;
  std::map<std::string, std::vector<Source>> pieces_;
  std::vector<std::string> names_;  // in the first file's order
  std::map<std::string, std::string> metadata_;
  std::string where_;
  bool sharded_ = false;
};

}  // namespace kuafu::train

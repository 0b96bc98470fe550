#include "core/train/checkpoint_shards.h"

#include <c10/util/accumulate.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/train/piece_reader.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::train {
namespace fs = std::filesystem;
namespace {

// A view of `whole` showing the block `cuts` name, each cut dimension split in two, [stride, block]
// (a view: splitting a dimension always is one). Cuts go from the last dimension back, so that the
// dimensions a split inserts do not move the ones still to cut.
torch::Tensor block_view(const torch::Tensor& whole, std::vector<parallel::BlockCut> cuts) {
  std::sort(cuts.begin(), cuts.end(), [](const auto& a, const auto& b) { return a.dim > b.dim; });
  torch::Tensor t = whole;
  for (const auto& cut : cuts) {
    std::vector<int64_t> shape = t.sizes().vec();
    const int64_t segment = shape[static_cast<size_t>(cut.dim)] / cut.stride;
    shape[static_cast<size_t>(cut.dim)] = segment;
    shape.insert(shape.begin() + cut.dim, cut.stride);
    const int64_t block = segment / cut.count;
    t = t.view(shape).narrow(cut.dim + 1, cut.index * block, block);
  }
  return t;
}

// Flat positions in `whole` of the block's elements [offset, offset + numel), in the block's order.
torch::Tensor positions_in_whole(const torch::Tensor& whole, const PiecePlace& place, int64_t numel) {
  const torch::Tensor view = block_view(whole, place.cuts);
  // The flat position of every element of the view: its storage offset plus each index times its stride.
  const auto options = torch::TensorOptions(torch::kInt64);
  torch::Tensor positions = torch::full({}, view.storage_offset() - whole.storage_offset(), options);
  for (int64_t d = 0; d < view.dim(); ++d) {
    std::vector<int64_t> along(static_cast<size_t>(view.dim()), 1);
    along[static_cast<size_t>(d)] = view.size(d);
    positions = positions + (torch::arange(view.size(d), options) * view.stride(d)).view(along);
  }
  return positions.reshape(-1).narrow(0, place.offset, numel);
}

}  // namespace

TensorPiece whole_piece(std::string name, torch::Tensor tensor) {
  PiecePlace place;
  place.shape = tensor.sizes().vec();
  return {std::move(name), std::move(tensor), std::move(place)};
}

std::vector<int64_t> block_shape(const PiecePlace& place) {
  std::vector<int64_t> shape = place.shape;
  for (const auto& cut : place.cuts) shape[static_cast<size_t>(cut.dim)] /= cut.count;
  return shape;
}

bool is_whole(const PiecePlace& place, int64_t numel) {
  return place.cuts.empty() && place.offset == 0 && numel == c10::multiply_integers(place.shape);
}

nlohmann::json place_to_json(const PiecePlace& place) {
  nlohmann::json cuts = nlohmann::json::array();
  for (const auto& cut : place.cuts) cuts.push_back({cut.dim, cut.stride, cut.count, cut.index});
  return {{"shape", place.shape}, {"cuts", cuts}, {"offset", place.offset}};
}

PiecePlace place_from_json(const nlohmann::json& json, const std::string& where) {
  const auto count = [&](const nlohmann::json& value, const char* what) {
    const bool whole_number = value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0);
    KUAFU_CHECK(whole_number && value.get<uint64_t>() <= (uint64_t{1} << 62), where, ": ", what,
                " must be a whole number >= 0, found ", text::abbreviate(value.dump()));
    return value.get<int64_t>();
  };
  KUAFU_CHECK(json.is_object() && json.contains("shape") && json.at("shape").is_array() && json.contains("cuts") &&
                  json.at("cuts").is_array() && json.contains("offset"),
              where, ": a piece's place needs \"shape\" (a list), \"cuts\" (a list) and \"offset\"");
  PiecePlace place;
  uint64_t elements = 1;
  for (const auto& d : json.at("shape")) {
    place.shape.push_back(count(d, "a dimension of \"shape\""));
    KUAFU_CHECK(!__builtin_mul_overflow(elements, static_cast<uint64_t>(place.shape.back()), &elements) &&
                    elements <= (uint64_t{1} << 62),
                where, ": \"shape\" has more elements than fit in 62 bits");
  }
  std::set<int64_t> dims;
  for (const auto& c : json.at("cuts")) {
    KUAFU_CHECK(c.is_array() && c.size() == 4, where, ": a cut is [dim, stride, count, index], found ",
                text::abbreviate(c.dump()));
    parallel::BlockCut cut{count(c[0], "a cut's dim"), count(c[1], "a cut's stride"), count(c[2], "a cut's count"),
                           count(c[3], "a cut's index")};
    KUAFU_CHECK(cut.dim < static_cast<int64_t>(place.shape.size()) && dims.insert(cut.dim).second, where, ": cut of ",
                "dimension ", cut.dim, " of a ", place.shape.size(), "-dimensional tensor (or a dimension cut twice)");
    KUAFU_CHECK(cut.stride >= 1 && cut.count >= 1 && cut.index < cut.count &&
                    place.shape[static_cast<size_t>(cut.dim)] % (cut.stride * cut.count) == 0,
                where, ": cut ", text::abbreviate(c.dump()), " does not divide dimension ", cut.dim, " of size ",
                place.shape[static_cast<size_t>(cut.dim)]);
    place.cuts.push_back(cut);
  }
  place.offset = count(json.at("offset"), "\"offset\"");
  return place;
}

torch::Tensor read_piece(const torch::Tensor& whole, const PiecePlace& place, int64_t numel) {
  if (place.cuts.empty()) return whole.reshape(-1).narrow(0, place.offset, numel).clone();
  if (place.offset == 0 && numel == c10::multiply_integers(block_shape(place))) {
    return block_view(whole, place.cuts).contiguous().view(-1).clone();
  }
  return whole.reshape(-1).index_select(0, positions_in_whole(whole, place, numel).to(whole.device()));
}

std::string whole_file_name(const std::string& part, const std::string& kind) {
  return (part.empty() ? kind : part + "." + kind) + ".safetensors";
}

std::string shard_file_name(const std::string& part, const std::string& kind, int rank) {
  return (part.empty() ? kind : part + "." + kind) + ".rank" + std::to_string(rank) + ".safetensors";
}

FileSum save_pieces(const std::string& path, const std::vector<TensorPiece>& pieces,
                    std::map<std::string, std::string> metadata,
                    const std::function<void(const torch::Tensor&)>& before_write) {
  io::NamedTensors tensors;
  nlohmann::json places = nlohmann::json::object();
  for (const TensorPiece& piece : pieces) {
    KUAFU_CHECK(!places.contains(piece.name), path, ": two pieces of '", piece.name, "' from one rank");
    places[piece.name] = place_to_json(piece.place);
    tensors.emplace_back(piece.name, piece.data);
  }
  metadata[kPiecesKey] = places.dump();
  return io::save_safetensors(path, tensors, metadata, before_write);
}

bool SavedTensors::exists(const std::string& folder, const std::string& part, const std::string& kind) {
  return fs::exists(fs::path(folder) / whole_file_name(part, kind)) ||
         fs::exists(fs::path(folder) / shard_file_name(part, kind, 0));
}

SavedTensors::SavedTensors(const std::string& folder, const std::string& part, const std::string& kind) {
  const fs::path whole = fs::path(folder) / whole_file_name(part, kind);
  if (fs::exists(whole)) {
    where_ = whole.string();
    files_.push_back(io::read_safetensors_index(where_));
  } else {
    // Every rank's file, rank0 to the last: the ranks that wrote them number as many as the files.
    sharded_ = true;
    where_ = (fs::path(folder) / shard_file_name(part, kind, 0)).string();
    KUAFU_CHECK(fs::exists(where_), "checkpoint ", folder, " has neither ", whole_file_name(part, kind), " nor ",
                shard_file_name(part, kind, 0), part.empty() ? std::string() : " (no model \"" + part + "\" in it)");
    for (int rank = 0; fs::exists(fs::path(folder) / shard_file_name(part, kind, rank)); ++rank) {
      files_.push_back(io::read_safetensors_index((fs::path(folder) / shard_file_name(part, kind, rank)).string()));
    }
    where_ = (fs::path(folder) / shard_file_name(part, kind, 0)).string() + " (and the other " +
             std::to_string(files_.size() - 1) + " ranks' files)";
  }
  metadata_ = files_.front().metadata;
  metadata_.erase(kPiecesKey);
  for (size_t f = 0; f < files_.size(); ++f) {
    const io::SafetensorsIndex& file = files_[f];
    nlohmann::json places;
    if (sharded_) {
      const auto found = file.metadata.find(kPiecesKey);
      KUAFU_CHECK(found != file.metadata.end(), file.path, ": a rank's shard file without its \"", kPiecesKey,
                  "\" metadata (where each piece lies)");
      try {
        places = nlohmann::json::parse(found->second);
      } catch (const nlohmann::json::exception& e) {
        fail(file.path + ": metadata \"" + kPiecesKey + "\" is not valid JSON: " + text::abbreviate(e.what(), 200));
      }
      KUAFU_CHECK(places.is_object(), file.path, ": metadata \"", kPiecesKey, "\" must be an object of places");
    }
    for (size_t e = 0; e < file.entries.size(); ++e) {
      const io::SafetensorsEntry& entry = file.entries[e];
      Source source{f, e, {}};
      if (sharded_) {
        KUAFU_CHECK(places.contains(entry.name), file.path, ": '", text::abbreviate(entry.name), "' has no place in \"",
                    kPiecesKey, "\"");
        source.place = place_from_json(places.at(entry.name), file.path + ": the place of '" + text::abbreviate(entry.name) + "'");
      } else {
        source.place.shape = entry.shape;
      }
      auto& list = pieces_[entry.name];
      if (list.empty()) names_.push_back(entry.name);
      const std::string where = file.path + ": '" + text::abbreviate(entry.name) + "'";
      if (!list.empty()) {
        const Source& first = list.front();
        KUAFU_CHECK(first.place.shape == source.place.shape &&
                        files_[first.file].entries[first.entry].dtype == entry.dtype,
                    where, " is a piece of a tensor of another shape or dtype than ", files_[first.file].path, "'s");
      }
      int64_t block = 1;
      for (int64_t d : block_shape(source.place)) block *= d;
      int64_t numel = 1;
      for (int64_t d : entry.shape) numel *= d;
      KUAFU_CHECK(source.place.offset <= block && numel <= block - source.place.offset, where, ": ", numel,
                  " elements from ", source.place.offset, " do not fit in its block of ", block);
      list.push_back(std::move(source));
    }
  }
  // Pieces that cover a tensor exactly once hold as many elements as it has: checked before any tensor is
  // made, so that no shape a file claims is allocated beyond what the files hold.
  for (const auto& [name, list] : pieces_) {
    int64_t held = 0;
    for (const Source& source : list) held += c10::multiply_integers(files_[source.file].entries[source.entry].shape);
    const int64_t whole = c10::multiply_integers(list.front().place.shape);
    KUAFU_CHECK(held == whole, where_, ": the pieces of '", text::abbreviate(name), "' hold ", held,
                " elements but its shape ", torch::IntArrayRef(list.front().place.shape), " has ", whole,
                " (a rank's file is missing, or pieces overlap)");
  }
}

const std::vector<SavedTensors::Source>& SavedTensors::sources(const std::string& name) const {
  const auto found = pieces_.find(name);
  KUAFU_CHECK(found != pieces_.end(), where_, ": holds no tensor '", text::abbreviate(name), "'");
  return found->second;
}

std::vector<int64_t> SavedTensors::shape(const std::string& name) const { return sources(name).front().place.shape; }

std::vector<SavedPiece> SavedTensors::saved_pieces(const std::vector<Source>& list) const {
  std::vector<SavedPiece> saved;
  for (const Source& source : list) {
    const io::SafetensorsIndex& file = files_[source.file];
    saved.push_back(piece_in_file(file, file.entries[source.entry], source.place));
  }
  return saved;
}

torch::Tensor SavedTensors::read(const std::string& name) const {
  const auto& list = sources(name);
  const Source& first = list.front();
  const io::SafetensorsEntry& first_entry = files_[first.file].entries[first.entry];
  if (!sharded_) return io::read_tensor(files_[first.file], first_entry);
  PiecePlace whole;
  whole.shape = first.place.shape;
  return assemble_piece(name, whole, c10::multiply_integers(whole.shape), saved_pieces(list), first_entry.dtype, where_).view(whole.shape);
}

torch::Tensor SavedTensors::read_piece(const std::string& name, const PiecePlace& place, int64_t numel) const {
  const auto& list = sources(name);
  KUAFU_CHECK(place.shape == list.front().place.shape, where_, ": '", text::abbreviate(name), "' has shape ",
              torch::IntArrayRef(list.front().place.shape), " but ", torch::IntArrayRef(place.shape), " is expected");
  const io::SafetensorsEntry& first = files_[list.front().file].entries[list.front().entry];
  return assemble_piece(name, place, numel, saved_pieces(list), first.dtype, where_);
}

}  // namespace kuafu::train

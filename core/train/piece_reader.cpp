#include "core/train/piece_reader.h"

#include <c10/util/accumulate.h>

#include <algorithm>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::train {
namespace {

using Shape = std::vector<int64_t>;

// A box of a block, in the block's coordinates, that is one run of the block's flattened elements.
struct Box {
  Shape begin, size;
  int64_t first = 0;  // the index of its first element in the piece (counted from the piece's offset)
};

// The boxes of elements [begin, end) of an array of `shape` from dimension `dim` on, the dimensions before
// it fixed at `prefix`: the partial first row, the whole rows, the partial last row (each split further).
// `first`: the piece index of element `begin`.
void split_run(const Shape& shape, Shape prefix, int64_t begin, int64_t end, int64_t first, std::vector<Box>& out) {
  if (begin >= end) return;
  const size_t dim = prefix.size();
  const int64_t row = c10::multiply_integers(shape.begin() + static_cast<std::ptrdiff_t>(dim) + 1, shape.end());
  const auto rows = [&](int64_t from, int64_t count, int64_t at) {  // rows [from, from + count), whole
    Box box{prefix, Shape(dim, 1), at};
    box.begin.push_back(from);
    box.size.push_back(count);
    for (size_t d = dim + 1; d < shape.size(); ++d) {
      box.begin.push_back(0);
      box.size.push_back(shape[d]);
    }
    out.push_back(std::move(box));
  };
  const auto within = [&](int64_t r, int64_t from, int64_t to, int64_t at) {  // part of row r
    Shape deeper = prefix;
    deeper.push_back(r);
    split_run(shape, deeper, from - r * row, to - r * row, at, out);
  };
  int64_t r = begin / row;
  if (begin % row != 0 || end < (r + 1) * row) {
    const int64_t to = std::min(end, (r + 1) * row);
    within(r, begin, to, first);
    first += to - begin;
    begin = to;
    ++r;
  }
  const int64_t whole = end / row - r;
  if (begin < end && whole > 0) {
    rows(r, whole, first);
    first += whole * row;
    begin += whole * row;
    r += whole;
  }
  if (begin < end) within(r, begin, end, first);
}

// The piece's boxes in its block.
std::vector<Box> boxes_of(const PiecePlace& place, int64_t numel) {
  std::vector<Box> boxes;
  split_run(block_shape(place), {}, place.offset, place.offset + numel, 0, boxes);
  return boxes;
}

// A run along one dimension: `length` indices from `block` in the block, from `whole` in the whole tensor.
struct Span {
  int64_t block = 0, whole = 0, length = 0;
};

// Where a box's indices [begin, begin + length) along dimension `dim` of the block lie in the whole
// tensor: one span per stride segment they cross.
std::vector<Span> spans_along(const PiecePlace& place, int64_t dim, int64_t begin, int64_t length) {
  const auto cut = std::find_if(place.cuts.begin(), place.cuts.end(), [&](const auto& c) { return c.dim == dim; });
  if (cut == place.cuts.end()) return {{begin, begin, length}};
  const int64_t segment = place.shape[static_cast<size_t>(dim)] / cut->stride, block = segment / cut->count;
  std::vector<Span> spans;
  for (int64_t i = begin; i < begin + length;) {
    const int64_t in_block = i % block, n = std::min(block - in_block, begin + length - i);
    spans.push_back({i, (i / block) * segment + cut->index * block + in_block, n});
    i += n;
  }
  return spans;
}

// A box with its spans along every dimension.
struct PlacedBox {
  Box box;
  std::vector<std::vector<Span>> spans;
};

std::vector<PlacedBox> placed_boxes(const PiecePlace& place, int64_t numel) {
  std::vector<PlacedBox> placed;
  for (Box& box : boxes_of(place, numel)) {
    PlacedBox p{std::move(box), {}};
    for (size_t d = 0; d < p.box.begin.size(); ++d) {
      p.spans.push_back(spans_along(place, static_cast<int64_t>(d), p.box.begin[d], p.box.size[d]));
    }
    placed.push_back(std::move(p));
  }
  return placed;
}

// What two boxes share along one dimension: runs of the same whole-tensor indices, each as the first
// index within either box and a length.
struct Shared {
  int64_t in_wanted = 0, in_saved = 0, length = 0;
};

std::vector<Shared> shared_along(const PlacedBox& wanted, const PlacedBox& saved, size_t dim) {
  std::vector<Shared> shared;
  for (const Span& w : wanted.spans[dim]) {
    for (const Span& s : saved.spans[dim]) {
      const int64_t from = std::max(w.whole, s.whole), to = std::min(w.whole + w.length, s.whole + s.length);
      if (from >= to) continue;
      shared.push_back({w.block + (from - w.whole) - wanted.box.begin[dim],
                        s.block + (from - s.whole) - saved.box.begin[dim], to - from});
    }
  }
  return shared;
}

// A view of the box's elements of the 1-D `piece` tensor, in the box's shape.
torch::Tensor box_view(const torch::Tensor& piece, const Box& box) {
  return piece.narrow(0, box.first, c10::multiply_integers(box.size)).view(box.size);
}

}  // namespace

SavedPiece piece_in_file(const io::SafetensorsIndex& file, const io::SafetensorsEntry& entry, PiecePlace place) {
  const int64_t numel = static_cast<int64_t>((entry.end - entry.begin) / c10::elementSize(entry.dtype));
  auto read = [&file, &entry](int64_t first, const Shape& shape, const Shape& begin, const Shape& size) {
    return io::read_box(file, entry, first, shape, begin, size);
  };
  return {std::move(place), numel, read, file.path};
}

torch::Tensor assemble_piece(const std::string& name, const PiecePlace& wanted, int64_t numel,
                             const std::vector<SavedPiece>& saved, torch::ScalarType dtype, const std::string& where) {
  torch::Tensor out = torch::empty({numel}, torch::TensorOptions(dtype));
  torch::Tensor covered = torch::zeros({numel}, torch::TensorOptions(torch::kBool));  // each element once
  // With no cut anywhere every piece is a run of the flattened tensor: seen as 1-D, each overlap is one read.
  const bool flat = wanted.cuts.empty() &&
                    std::all_of(saved.begin(), saved.end(), [](const SavedPiece& s) { return s.place.cuts.empty(); });
  const auto geometry = [&](const PiecePlace& place) {
    return flat ? PiecePlace{{c10::multiply_integers(place.shape)}, {}, place.offset} : place;
  };
  const std::vector<PlacedBox> wanted_boxes = placed_boxes(geometry(wanted), numel);
  for (const SavedPiece& piece : saved) {
    for (const PlacedBox& s : placed_boxes(geometry(piece.place), piece.numel)) {
      for (const PlacedBox& w : wanted_boxes) {
        std::vector<std::vector<Shared>> along;
        for (size_t d = 0; d < w.spans.size(); ++d) {
          along.push_back(shared_along(w, s, d));
          if (along.back().empty()) break;
        }
        if (along.size() < w.spans.size() || along.back().empty()) continue;  // nothing shared
        // Every combination of the shared runs along each dimension is one box both hold.
        std::vector<size_t> pick(along.size(), 0);
        while (true) {
          Shape in_wanted, in_saved, size;
          for (size_t d = 0; d < along.size(); ++d) {
            const Shared& run = along[d][pick[d]];
            in_wanted.push_back(run.in_wanted);
            in_saved.push_back(run.in_saved);
            size.push_back(run.length);
          }
          torch::Tensor into = box_view(out, w.box), marks = box_view(covered, w.box);
          for (size_t d = 0; d < size.size(); ++d) {
            into = into.narrow(static_cast<int64_t>(d), in_wanted[d], size[d]);
            marks = marks.narrow(static_cast<int64_t>(d), in_wanted[d], size[d]);
          }
          KUAFU_CHECK(!marks.any().item<bool>(), piece.where, ": its piece of '", text::abbreviate(name),
                      "' overlaps another rank's");
          marks.fill_(true);
          into.copy_(piece.read_box(s.box.first, s.box.size, in_saved, size));
          size_t d = along.size();
          while (d > 0 && ++pick[d - 1] == along[d - 1].size()) pick[--d] = 0;
          if (d == 0) break;
        }
      }
    }
  }
  const int64_t missing = numel - covered.sum().item<int64_t>();
  KUAFU_CHECK(missing == 0, where, ": the pieces of '", text::abbreviate(name), "' leave ", missing, " of elements [",
              wanted.offset, ", ", wanted.offset + numel, ") unwritten (a rank's file is missing?)");
  return out;
}

torch::Tensor read_block(const io::SafetensorsIndex& file, const io::SafetensorsEntry& entry,
                         const std::vector<parallel::BlockCut>& cuts) {
  PiecePlace whole;
  whole.shape = entry.shape;
  const PiecePlace block{entry.shape, cuts, 0};
  const Shape shape = block_shape(block);
  return assemble_piece(entry.name, block, c10::multiply_integers(shape), {piece_in_file(file, entry, whole)}, entry.dtype, file.path)
      .view(shape);
}

}  // namespace kuafu::train

// Sharded checkpoint files (checkpoint_shards.h): pieces written by several "ranks" (each its own file)
// rebuild the whole tensor exactly, whatever the cut: a tensor-parallel block (strided, as the fused QKV
// projection is cut, or along two dimensions), a flat run of elements (a ZeRO/Gemini piece), or a run
// within a block (both). The blocks are checked against index lists worked out by hand. Any layout's
// piece is read from any other layout's files touching only its own bytes (counted). Pieces that
// overlap or leave a gap, a rank's file gone and places no writer makes are refused, naming the file.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/train/checkpoint_shards.h"
#include "core/train/piece_reader.h"
#include "tests/support/test_util.h"

namespace kuafu::train {
namespace {
namespace fs = std::filesystem;

using testing::Contains;
using testing::error_message;

// 0, 1, 2, ... in `shape`: every element names its own position.
torch::Tensor counting(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return torch::arange(numel, torch::TensorOptions(torch::kFloat32)).view(shape);
}

// Writes each rank's pieces to its file in `folder` (part "", kind "model").
void write_ranks(const fs::path& folder, const std::vector<std::vector<TensorPiece>>& ranks) {
  fs::create_directories(folder);
  for (size_t r = 0; r < ranks.size(); ++r) {
    save_pieces((folder / shard_file_name("", "model", static_cast<int>(r))).string(), ranks[r], {{"format", "pt"}});
  }
}

TensorPiece piece_at(const torch::Tensor& whole, PiecePlace place, int64_t numel) {
  place.shape = whole.sizes().vec();
  return {"w", read_piece(whole, place, numel), place};
}

TEST(CheckpointShardsTest, AStridedBlockIsTheRowsWorkedOutByHand) {
  // 12 rows = 3 segments (q | k | v) of 4, each cut into 2 blocks of 2 rows: block 1 holds rows 2, 3 of
  // each segment, i.e. rows 2, 3, 6, 7, 10, 11.
  const torch::Tensor whole = counting({12, 5});
  PiecePlace place;
  place.shape = {12, 5};
  place.cuts = {{0, 3, 2, 1}};
  const torch::Tensor block = read_piece(whole, place, 30).view({6, 5});
  const torch::Tensor rows = torch::tensor({2, 3, 6, 7, 10, 11}, torch::kInt64);
  EXPECT_TRUE(torch::equal(block, whole.index_select(0, rows)));
  EXPECT_EQ(block_shape(place), (std::vector<int64_t>{6, 5}));
}

TEST(CheckpointShardsTest, ATwoDimensionalBlockIsTheGridCellWorkedOutByHand) {
  // [4, 6] cut 2 x 3: block (1, 2) is rows 2..3, columns 4..5.
  const torch::Tensor whole = counting({4, 6});
  PiecePlace place;
  place.shape = {4, 6};
  place.cuts = {{0, 1, 2, 1}, {1, 1, 3, 2}};
  EXPECT_TRUE(torch::equal(read_piece(whole, place, 4).view({2, 2}), torch::tensor({{16.f, 17.f}, {22.f, 23.f}})));
  // A run inside that block (a ZeRO piece of a tensor-parallel block): its elements 1..2 are 17, 22.
  place.offset = 1;
  EXPECT_TRUE(torch::equal(read_piece(whole, place, 2), torch::tensor({17.f, 22.f})));
}

TEST(CheckpointShardsTest, PiecesOfEveryCutRebuildTheWholeTensor) {
  const fs::path root = testing::temp_dir("shards_rebuild");
  const torch::Tensor whole = torch::randn({12, 6});
  struct Case {
    std::string name;
    std::vector<std::vector<TensorPiece>> ranks;
  };
  std::vector<Case> cases;
  // ZeRO: 3 ranks, flat runs of 30, 30 and 12 elements.
  cases.push_back({"flat", {{piece_at(whole, {{}, {}, 0}, 30)}, {piece_at(whole, {{}, {}, 30}, 30)},
                            {piece_at(whole, {{}, {}, 60}, 12)}}});
  // 1D with a stride of 3 over 2 ranks, each block then split over 2 data ranks (ZeRO x tensor).
  std::vector<std::vector<TensorPiece>> strided;
  for (int64_t block = 0; block < 2; ++block) {
    for (int64_t half = 0; half < 2; ++half) {
      strided.push_back({piece_at(whole, {{}, {{0, 3, 2, block}}, half * 18}, 18)});
    }
  }
  cases.push_back({"strided_zero", strided});
  // 2D grid 2 x 3, a rank of it holding nothing (an empty file).
  std::vector<std::vector<TensorPiece>> grid;
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 3; ++j) grid.push_back({piece_at(whole, {{}, {{0, 1, 2, i}, {1, 1, 3, j}}, 0}, 12)});
  }
  grid.push_back({});
  cases.push_back({"grid", grid});
  for (const Case& c : cases) {
    write_ranks(root / c.name, c.ranks);
    const SavedTensors saved(( root / c.name).string(), "", "model");
    EXPECT_TRUE(saved.sharded()) << c.name;
    EXPECT_EQ(saved.names(), std::vector<std::string>{"w"}) << c.name;
    EXPECT_EQ(saved.shape("w"), (std::vector<int64_t>{12, 6})) << c.name;
    EXPECT_EQ(saved.metadata().at("format"), "pt") << c.name;
    EXPECT_TRUE(torch::equal(saved.read("w"), whole)) << c.name;
    // Another layout's pieces, read alone: a run across two saved pieces, and a run of a strided block.
    PiecePlace run{{12, 6}, {}, 25};
    EXPECT_TRUE(torch::equal(saved.read_piece("w", run, 40), whole.reshape(-1).narrow(0, 25, 40))) << c.name;
    PiecePlace block_run{{12, 6}, {{0, 3, 2, 0}}, 5};
    EXPECT_TRUE(torch::equal(saved.read_piece("w", block_run, 20), read_piece(whole, block_run, 20))) << c.name;
  }
}

TEST(CheckpointShardsTest, AWholeFileIsReadAsItIs) {
  const fs::path folder = testing::temp_dir("shards_whole");
  const torch::Tensor w = torch::randn({3, 4});
  io::save_safetensors((folder / whole_file_name("unet", "optimizer")).string(), {{"w/exp_avg", w}}, {{"optimizer", "adamw"}});
  const SavedTensors saved(folder.string(), "unet", "optimizer");
  EXPECT_FALSE(saved.sharded());
  EXPECT_TRUE(torch::equal(saved.read("w/exp_avg"), w));
  EXPECT_EQ(saved.metadata().at("optimizer"), "adamw");
  EXPECT_EQ(whole_file_name("", "model"), "model.safetensors");
  EXPECT_EQ(shard_file_name("unet.ema", "model", 3), "unet.ema.model.rank3.safetensors");
}

TEST(CheckpointShardsTest, OverlapsGapsAndMissingRanksAreNamed) {
  const fs::path root = testing::temp_dir("shards_bad");
  const torch::Tensor whole = torch::randn({4, 4});
  // Pieces holding more or fewer elements than the tensor: refused when the files are opened, before any
  // tensor of the shape they claim is made.
  write_ranks(root / "extra", {{piece_at(whole, {{}, {}, 0}, 10)}, {piece_at(whole, {{}, {}, 8}, 8)}});
  EXPECT_TRUE(Contains(error_message([&] { SavedTensors((root / "extra").string(), "", "model"); }),
                       "the pieces of 'w' hold 18 elements but its shape [4, 4] has 16"));
  // Rank 1 of 3 lost: ranks 0 only is read, and its pieces do not cover the tensor.
  write_ranks(root / "lost", {{piece_at(whole, {{}, {}, 0}, 6)}, {piece_at(whole, {{}, {}, 6}, 5)},
                              {piece_at(whole, {{}, {}, 11}, 5)}});
  fs::remove(root / "lost" / shard_file_name("", "model", 1));
  EXPECT_TRUE(Contains(error_message([&] { SavedTensors((root / "lost").string(), "", "model"); }),
                       "hold 6 elements but its shape [4, 4] has 16 (a rank's file is missing, or pieces overlap)"));
  // As many elements as the tensor, but [4, 8) twice and [12, 16) not at all.
  write_ranks(root / "overlap", {{piece_at(whole, {{}, {}, 0}, 8)}, {piece_at(whole, {{}, {}, 4}, 8)}});
  const SavedTensors overlapping((root / "overlap").string(), "", "model");
  EXPECT_TRUE(Contains(error_message([&] { overlapping.read("w"); }),
                       "model.rank1.safetensors: its piece of 'w' overlaps another rank's"));
  EXPECT_TRUE(Contains(error_message([&] { overlapping.read_piece("w", {{4, 4}, {}, 2}, 4); }),
                       "model.rank1.safetensors: its piece of 'w' overlaps another rank's"));
  EXPECT_TRUE(Contains(error_message([&] { overlapping.read_piece("w", {{4, 4}, {}, 12}, 4); }),
                       "leave 4 of elements [12, 16) unwritten"));
  EXPECT_TRUE(Contains(error_message([&] { overlapping.read_piece("w", {{16}, {}, 0}, 6); }),
                       "'w' has shape [4, 4] but [16] is expected"));
  EXPECT_TRUE(Contains(error_message([&] { SavedTensors((root / "none").string(), "", "model"); }),
                       "has neither model.safetensors nor model.rank0.safetensors"));
  // A piece longer than its block.
  write_ranks(root / "long", {{{"w", torch::zeros({20}), {{4, 4}, {}, 0}}}});
  EXPECT_TRUE(Contains(error_message([&] { SavedTensors((root / "long").string(), "", "model"); }),
                       "20 elements from 0 do not fit in its block of 16"));
  // A shape of 2^62 elements claimed by 4 bytes of data.
  write_ranks(root / "huge", {{{"w", torch::zeros({1}), {{int64_t{1} << 31, int64_t{1} << 31}, {}, 0}}}});
  EXPECT_TRUE(Contains(error_message([&] { SavedTensors((root / "huge").string(), "", "model"); }),
                       "hold 1 elements but its shape [2147483648, 2147483648] has 4611686018427387904"));
}

TEST(CheckpointShardsTest, PlacesNoWriterMakesAreRefused) {
  const std::string where = "file: the place of 'w'";
  EXPECT_TRUE(Contains(error_message([&] {
                         place_from_json({{"shape", {6, 4}}, {"cuts", {{0, 1, 4, 0}}}, {"offset", 0}}, where);
                       }),
                       "does not divide dimension 0 of size 6"));
  EXPECT_TRUE(Contains(error_message([&] {
                         place_from_json({{"shape", {6, 4}}, {"cuts", {{2, 1, 2, 0}}}, {"offset", 0}}, where);
                       }),
                       "cut of dimension 2 of a 2-dimensional tensor"));
  EXPECT_TRUE(Contains(error_message([&] {
                         place_from_json({{"shape", {6, 4}}, {"cuts", {{0, 1, 2, 2}}}, {"offset", 0}}, where);
                       }),
                       "does not divide"));
  EXPECT_TRUE(Contains(error_message([&] { place_from_json({{"shape", {-1}}, {"cuts", nlohmann::json::array()}, {"offset", 0}}, where); }),
                       "a dimension of \"shape\" must be a whole number >= 0"));
  EXPECT_TRUE(Contains(error_message([&] {
                         place_from_json({{"shape", {1u << 31, 1u << 31, 4}}, {"cuts", nlohmann::json::array()}, {"offset", 0}}, where);
                       }),
                       "more elements than fit in 62 bits"));
  const PiecePlace back = place_from_json(place_to_json({{12, 6}, {{0, 3, 2, 1}}, 7}), where);
  EXPECT_EQ(back.shape, (std::vector<int64_t>{12, 6}));
  EXPECT_EQ(back.cuts.size(), 1u);
  EXPECT_EQ(back.cuts[0].stride, 3);
  EXPECT_EQ(back.offset, 7);
}

TEST(CheckpointShardsTest, ARangeOfATensorIsReadWithoutTheRest) {
  const fs::path folder = testing::temp_dir("shards_range");
  const torch::Tensor a = torch::randn({5, 3}), b = torch::randn({7});
  io::save_safetensors((folder / "f.safetensors").string(), {{"a", a}, {"b", b}});
  const io::SafetensorsIndex index = io::read_safetensors_index((folder / "f.safetensors").string());
  ASSERT_EQ(index.entries.size(), 2u);
  EXPECT_TRUE(torch::equal(io::read_elements(index, *index.find("a"), 4, 6), a.reshape(-1).narrow(0, 4, 6)));
  EXPECT_TRUE(torch::equal(io::read_tensor(index, *index.find("b")), b));
  EXPECT_TRUE(Contains(error_message([&] { io::read_elements(index, *index.find("b"), 5, 3); }),
                       "elements [5, 8) of 7 asked for"));
}

TEST(CheckpointShardsTest, ABoxOfAFileIsReadAloneRunByRun) {
  const fs::path folder = testing::temp_dir("shards_box");
  const torch::Tensor a = torch::randn({4, 5, 6});
  io::save_safetensors((folder / "f.safetensors").string(), {{"pad", torch::randn({3})}, {"a", a}});
  const io::SafetensorsIndex index = io::read_safetensors_index((folder / "f.safetensors").string());
  const io::SafetensorsEntry& entry = *index.find("a");
  const uint64_t before = io::tensor_bytes_read();
  // Rows 1..2, columns 2..4 of every matrix 1..3: 3 x 2 runs of 3 elements.
  EXPECT_TRUE(torch::equal(io::read_box(index, entry, 0, {4, 5, 6}, {1, 1, 2}, {3, 2, 3}),
                           a.narrow(0, 1, 3).narrow(1, 1, 2).narrow(2, 2, 3)));
  EXPECT_EQ(io::tensor_bytes_read() - before, 3u * 2 * 3 * 4);
  // The elements from 30 on seen as a [3, 5, 6] array (a run of the tensor): its last two matrices whole.
  EXPECT_TRUE(torch::equal(io::read_box(index, entry, 30, {3, 5, 6}, {1, 0, 0}, {2, 5, 6}), a.narrow(0, 2, 2)));
  EXPECT_TRUE(Contains(error_message([&] { io::read_box(index, entry, 30, {4, 5, 6}, {0, 0, 0}, {1, 1, 1}); }),
                       "does not lie in its 120 elements"));
  EXPECT_TRUE(Contains(error_message([&] { io::read_box(index, entry, 0, {4, 5, 6}, {0, 4, 0}, {1, 2, 1}); }),
                       "a box of [1, 2, 1] at [0, 4, 0] of [4, 5, 6]"));
}

// Every layout's piece read from every other layout's files equals the piece cut from the whole tensor
// in memory (read_piece, checked by hand above), and reads exactly its own bytes.
TEST(CheckpointShardsTest, AnyLayoutsPieceIsReadFromAnyOtherLayoutsFilesTouchingOnlyItsBytes) {
  const fs::path root = testing::temp_dir("shards_any");
  const torch::Tensor whole = torch::randn({12, 6, 4});  // [12, 6, 4]
  const int64_t numel = whole.numel();
  // Layouts as the pieces of every rank: each block cut into `runs` runs of its elements (ZeRO over as
  // many data ranks; the last run the shortest, as a chunk's tail is).
  using parallel::BlockCut;
  struct Layout {
    std::string name;
    std::vector<std::vector<BlockCut>> blocks;
    int64_t runs = 1;
  };
  const std::vector<Layout> layouts = {
      {"whole", {{}}, 1},
      {"zero3", {{}}, 3},
      {"rows2", {{{0, 1, 2, 0}}, {{0, 1, 2, 1}}}, 1},
      {"qkv_cols2_zero2", {{{1, 3, 2, 0}}, {{1, 3, 2, 1}}}, 2},
      {"grid2x2", {{{0, 1, 2, 0}, {2, 1, 2, 0}}, {{0, 1, 2, 0}, {2, 1, 2, 1}}, {{0, 1, 2, 1}, {2, 1, 2, 0}},
                   {{0, 1, 2, 1}, {2, 1, 2, 1}}}, 1},
      {"strided_rows3_zero2", {{{0, 2, 3, 0}}, {{0, 2, 3, 1}}, {{0, 2, 3, 2}}}, 2},
  };
  const auto pieces_of = [&](const Layout& layout) {
    std::vector<std::pair<PiecePlace, int64_t>> pieces;
    for (const auto& cuts : layout.blocks) {
      int64_t block = 1;
      for (int64_t d : block_shape({whole.sizes().vec(), cuts, 0})) block *= d;
      const int64_t run = (block + layout.runs - 1) / layout.runs;
      for (int64_t from = 0; from < block; from += run) {
        pieces.push_back({{whole.sizes().vec(), cuts, from}, std::min(run, block - from)});
      }
    }
    return pieces;
  };
  for (const Layout& saved : layouts) {
    std::vector<std::vector<TensorPiece>> ranks;
    for (const auto& [place, n] : pieces_of(saved)) ranks.push_back({piece_at(whole, place, n)});
    write_ranks(root / saved.name, ranks);
    const SavedTensors files((root / saved.name).string(), "", "model");
    for (const Layout& wanted : layouts) {
      for (const auto& [place, n] : pieces_of(wanted)) {
        const uint64_t before = io::tensor_bytes_read();
        EXPECT_TRUE(torch::equal(files.read_piece("w", place, n), read_piece(whole, place, n)))
            << wanted.name << " from " << saved.name << " at offset " << place.offset;
        EXPECT_EQ(io::tensor_bytes_read() - before, static_cast<uint64_t>(n) * 4) << wanted.name << " from " << saved.name;
      }
    }
    const uint64_t before = io::tensor_bytes_read();
    EXPECT_TRUE(torch::equal(files.read("w"), whole)) << saved.name;
    EXPECT_EQ(io::tensor_bytes_read() - before, static_cast<uint64_t>(numel) * 4) << saved.name;
  }
}

TEST(CheckpointShardsTest, ABlockOfAWholeFileIsReadAlone) {
  const fs::path folder = testing::temp_dir("shards_block");
  const torch::Tensor w = torch::randn({8, 9});
  io::save_safetensors((folder / "model.safetensors").string(), {{"w", w}});
  const io::SafetensorsIndex index = io::read_safetensors_index((folder / "model.safetensors").string());
  // The fused q|k|v columns cut over 3 ranks, rank 1's block: columns 1, 4 and 7.
  const uint64_t before = io::tensor_bytes_read();
  const torch::Tensor block = read_block(index, *index.find("w"), {{1, 3, 3, 1}});
  EXPECT_TRUE(torch::equal(block, w.index_select(1, torch::tensor({1, 4, 7}))));
  EXPECT_EQ(io::tensor_bytes_read() - before, 8u * 3 * 4);
}

}  // namespace
}  // namespace kuafu::train

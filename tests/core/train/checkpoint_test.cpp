// Safetensors and checkpoint folders: round trips, and every kind of damage refused with a message
// that names the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "core/io/hf_folder.h"
#include "core/io/safetensors.h"
#include "core/optim/algorithms.h"
#include "core/train/checkpoint.h"
#include "tests/support/optimizers.h"
#include "tests/support/test_util.h"

namespace kuafu {
namespace {
namespace fs = std::filesystem;

using testing::temp_dir;
std::string message_of(const std::function<void()>& f) { return testing::error_message(f); }

TEST(SafetensorsTest, RoundTripKeepsNamesOrderDtypesAndValues) {
  const auto path = (temp_dir("st") / "a.safetensors").string();
  io::NamedTensors tensors = {{"z.weight", torch::randn({3, 4})},
                              {"a.bias", torch::arange(5, torch::kInt64)},
                              {"m.half", torch::randn({2, 2}).to(torch::kBFloat16)},
                              {"empty", torch::zeros({0, 3})}};
  io::save_safetensors(path, tensors, {{"format", "pt"}});
  const auto loaded = io::load_safetensors(path);
  ASSERT_EQ(loaded.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(loaded.tensors[i].first, tensors[i].first);
    EXPECT_EQ(loaded.tensors[i].second.scalar_type(), tensors[i].second.scalar_type());
    EXPECT_TRUE(torch::equal(loaded.tensors[i].second, tensors[i].second));
  }
  EXPECT_EQ(loaded.metadata.at("format"), "pt");
  // The header is 8-byte aligned JSON, as the format requires for zero-copy readers.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

// Other writers need not align: a header of odd length and a float tensor at an odd offset load by
// copying (a zero-copy view would be misaligned).
TEST(SafetensorsTest, OddAlignedTensorsLoad) {
  const auto path = (temp_dir("st_odd") / "odd.safetensors").string();
  std::string header =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  while (header.size() % 4 != 1) header += ' ';  // b then starts at byte 8 + length + 1 = 2 (mod 4)
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  bytes += header;
  bytes.push_back(static_cast<char>(7));
  const float values[2] = {1.5f, -2.25f};
  bytes.append(reinterpret_cast<const char*>(values), sizeof values);
  std::ofstream(path, std::ios::binary) << bytes;
  const auto loaded = io::load_safetensors(path);
  EXPECT_EQ(loaded.find("a")->item<uint8_t>(), 7);
  EXPECT_TRUE(torch::equal(*loaded.find("b"), torch::tensor({1.5f, -2.25f})));
}

TEST(SafetensorsTest, TruncatedAndGarbageFilesAreRefused) {
  const auto dir = temp_dir("st_bad");
  const auto path = (dir / "t.safetensors").string();
  io::save_safetensors(path, {{"w", torch::randn({64})}});
  fs::resize_file(path, fs::file_size(path) - 10);
  EXPECT_NE(message_of([&] { io::load_safetensors(path); }).find("truncated"), std::string::npos);
  std::ofstream((dir / "g.safetensors").string()) << "not a tensor file at all";
  EXPECT_NE(message_of([&] { io::load_safetensors((dir / "g.safetensors").string()); }).find("g.safetensors"),
            std::string::npos);
}

// A safetensors file from raw header text and `data_bytes` zero bytes of data; `claimed_length`
// replaces the header's length field when given.
std::string write_raw_safetensors(const fs::path& dir, const std::string& name, const std::string& header,
                                  size_t data_bytes, std::optional<uint64_t> claimed_length = std::nullopt) {
  const uint64_t length = claimed_length.value_or(header.size());
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  bytes += header;
  bytes.append(data_bytes, '\0');
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The error of loading a file with this header, checked to name the file.
std::string header_error(const std::string& header, size_t data_bytes,
                         std::optional<uint64_t> claimed_length = std::nullopt) {
  const auto path = write_raw_safetensors(temp_dir("st_header"), "h.safetensors", header, data_bytes, claimed_length);
  const std::string message = testing::expected_error([&] { io::load_safetensors(path); });
  EXPECT_TRUE(testing::Contains(message, path + ": "));
  return message;
}

TEST(SafetensorsTest, OffsetsMustBeIntegersAndNamesUniqueAndNonEmpty) {
  using testing::Contains;
  EXPECT_TRUE(Contains(header_error(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0.0,16.0]}})", 16),
                       "tensor 'w': data_offsets: expected two non-negative integers [begin, end], found [0.0,16.0]"));
  EXPECT_TRUE(Contains(header_error(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                    R"("w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}})", 32),
                       "tensor 'w': named twice in the header"));
  EXPECT_TRUE(Contains(header_error(R"({"":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16),
                       "tensor '': expected a non-empty name"));
}

// A sharded folder's index may name only files of the folder itself: ".", "..", "" and paths are
// refused naming the entry.
TEST(HfFolderTest, AnIndexEntryNamingNoFileOfTheFolderIsRefused) {
  const auto dir = temp_dir("hf_index");
  std::ofstream(dir / "config.json") << "{}";
  for (const std::string shard : {".", "..", "", "sub/w.safetensors"}) {
    std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", {{"w", shard}}}}.dump();
    EXPECT_TRUE(testing::Contains(testing::expected_error([&] { io::read_hf_folder(dir.string()); }),
                                  "model.safetensors.index.json: weight_map[\"w\"] = \"" + shard +
                                      "\" is not a file name in this folder"));
  }
}

// Before: an export that failed or was killed left <out>.partial-<pid> folders nobody cleaned. A failed
// one now removes its own; the next export into the same path removes those of processes that are gone
// and keeps a live one's.
TEST(HfFolderTest, AFailedExportLeavesNothingAndDeadExportsAreCleaned) {
  const auto dir = temp_dir("hf_export");
  const fs::path out = dir / "model";
  const fs::path dead = dir / "model.partial-999999999", live = dir / ("model.partial-" + std::to_string(::getppid()));
  fs::create_directories(dead);
  fs::create_directories(live);
  EXPECT_ANY_THROW(io::write_hf_folder(out.string(), {{"model_type", "x"}}, {{"w", torch::Tensor()}}, {}));
  EXPECT_FALSE(fs::exists(dir / ("model.partial-" + std::to_string(::getpid()))));
  EXPECT_FALSE(fs::exists(out));
  io::write_hf_folder(out.string(), {{"model_type", "x"}}, {{"w", torch::ones({2})}}, {});
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
}

TEST(SafetensorsTest, DamagedHeadersAreRefusedNamingFileAndTensor) {
  using testing::Contains;
  const auto entry = [](const std::string& shape, const std::string& offsets, const std::string& dtype = "\"F32\"") {
    return R"({"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
  };
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4]", "[16,0]") + "}", 16),
                       "tensor 'w': data_offsets: expected begin <= end, found [16,0]"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4]", "[0,16,32]") + "}", 32),
                       "tensor 'w': data_offsets: expected two non-negative integers [begin, end], found [0,16,32]"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4]", "[-16,0]") + "}", 16),
                       "tensor 'w': data_offsets: expected two non-negative integers"));
  EXPECT_TRUE(Contains(header_error("{\"a\":" + entry("[4]", "[0,16]") + ",\"b\":" + entry("[4]", "[8,24]") + "}", 24),
                       "tensor data ranges of 'a' and 'b' overlap"));
  EXPECT_TRUE(Contains(header_error("{\"a\":" + entry("[4]", "[0,16]") + ",\"b\":" + entry("[4]", "[24,40]") + "}", 40),
                       "data bytes [16, 24) belong to no tensor (a gap before 'b')"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4]", "[0,16]") + "}", 20),
                       "the last 4 data bytes belong to no tensor (trailing bytes after the data of 'w')"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4]", "[4,20]") + "}", 20),
                       "data bytes [0, 4) belong to no tensor (a gap before 'w')"));
  EXPECT_TRUE(Contains(header_error("{}", 8), "the last 8 data bytes belong to no tensor (trailing bytes after the data of no tensor)"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[8]", "[0,32]") + "}", 16),
                       "tensor 'w': data ends at byte 32 but the file holds only 16 data bytes"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4611686018427387904,4611686018427387904]", "[0,0]") + "}", 0),
                       "tensor 'w': shape [4611686018427387904,4611686018427387904] has more elements than fit in 64 bits"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4611686018427387904]", "[0,0]") + "}", 0),
                       "tensor 'w': shape [4611686018427387904] of F32 needs more bytes than fit in 64 bits"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4.0]", "[0,16]") + "}", 16),
                       "tensor 'w': shape: expected a list of non-negative integers, found [4.0]"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[-4]", "[0,16]") + "}", 16),
                       "tensor 'w': shape: expected a list of non-negative integers, found [-4]"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4]", "[0,16]", "5") + "}", 16),
                       "tensor 'w': dtype: expected a string such as \"F32\", found 5"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4]", "[0,16]") + "}", 16, 1000),
                       "header length 1000 exceeds the file size"));
  EXPECT_TRUE(Contains(header_error("{\"w\":" + entry("[4]", "[0,16]") + "}", 16, ~uint64_t{0}),
                       "header length 18446744073709551615 exceeds the file size"));
  EXPECT_TRUE(Contains(header_error(R"({"__metadata__":"x"})", 0), "__metadata__: expected an object of strings"));
  // A huge name is echoed short.
  const std::string long_name(100'000, 'n');
  const std::string message = header_error("{\"" + long_name + "\":" + entry("[4]", "[16,0]") + "}", 16);
  EXPECT_LT(message.size(), 1000u);
  EXPECT_TRUE(Contains(message, "(100000 bytes)"));
}

TEST(SafetensorsTest, CheckLoadableRefusesDtypeChangesOtherThanAmongFloatWidths) {
  const torch::Tensor f32 = torch::zeros({4});
  // I32 bits copied into F32 weights evaluated to a loss of 6.5e10.
  const std::string message =
      testing::expected_error([&] { io::check_loadable("m.safetensors", "fc.weight", torch::ones({4}, torch::kInt32), f32); });
  EXPECT_TRUE(testing::Contains(message, "m.safetensors: tensor 'fc.weight' is stored as I32 but expected F32"));
  EXPECT_NO_THROW(io::check_loadable("m", "w", torch::ones({4}, torch::kFloat16), f32));
  EXPECT_NO_THROW(io::check_loadable("m", "w", torch::ones({4}, torch::kBFloat16), f32));
  EXPECT_NO_THROW(io::check_loadable("m", "w", f32, torch::zeros({4}, torch::kBFloat16)));
  EXPECT_NO_THROW(io::check_loadable("m", "w", torch::ones({4}, torch::kFloat64), f32));
  EXPECT_NO_THROW(io::check_loadable("m", "w", torch::ones({4}, torch::kInt64), torch::zeros({4}, torch::kInt64)));
  EXPECT_THROW(io::check_loadable("m", "w", torch::ones({4}, torch::kInt64), torch::zeros({4}, torch::kInt32)), Error);
  EXPECT_THROW(io::check_loadable("m", "w", torch::ones({4}, torch::kBool), torch::zeros({4}, torch::kUInt8)), Error);
  EXPECT_THROW(io::check_loadable("m", "w", f32, torch::zeros({4}, torch::kInt64)), Error);
}

TEST(SafetensorsTest, CheckLoadableRefusesNonFiniteValues) {
  torch::Tensor weights = torch::ones({8});
  weights[1] = std::numeric_limits<float>::quiet_NaN();
  weights[5] = std::numeric_limits<float>::infinity();
  weights[6] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { io::check_loadable("m.safetensors", "fc.weight", weights, weights); }),
                                "m.safetensors: tensor 'fc.weight' holds 3 non-finite values (NaN or infinity) among 8"));
  // Narrowing must not make values infinite either: 1e5 is beyond F16.
  const torch::Tensor large = torch::full({4}, 1e5);
  EXPECT_TRUE(testing::Contains(
      testing::expected_error([&] { io::check_loadable("m.safetensors", "w", large, torch::zeros({4}, torch::kFloat16)); }),
      "m.safetensors: tensor 'w': 4 of its 4 F32 values overflow F16"));
  EXPECT_NO_THROW(io::check_loadable("m", "w", large, torch::zeros({4}, torch::kBFloat16)));
}

struct OneLinear : torch::nn::Module {
  OneLinear() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
  }
  torch::nn::Linear fc{nullptr};
};

using testing::adamw_for;

TEST(CheckpointTest, SaveLoadRoundTripAndDamageIsRefused) {
  const auto root = (temp_dir("ckpt") / "checkpoints").string();
  auto world = dist::World::single();
  train::CheckpointStore store(root, world->world_group(), /*keep=*/2);
  OneLinear model;
  auto optimizer = adamw_for(model);
  model.fc->forward(torch::randn({2, 4})).sum().backward();
  optimizer->step();
  for (int64_t step : {10, 20, 30}) store.save(step, train::named_weights(model), *optimizer, {{"note", "x"}});
  ASSERT_TRUE(store.latest());
  EXPECT_EQ(*store.latest(), train::checkpoint_folder(root, 30));
  EXPECT_FALSE(fs::exists(train::checkpoint_folder(root, 10))) << "keep=2 must prune the oldest";

  OneLinear other;
  auto other_optimizer = adamw_for(other);
  const auto state = train::CheckpointStore::load(*store.latest(), train::named_weights(other), *other_optimizer, {});
  EXPECT_EQ(state.at("step"), 30);
  EXPECT_TRUE(torch::equal(other.fc->weight, model.fc->weight));
  const auto saved_state = optimizer->state_tensors(), loaded_state = other_optimizer->state_tensors();
  ASSERT_EQ(saved_state.size(), loaded_state.size());
  for (size_t i = 0; i < saved_state.size(); ++i) {
    EXPECT_EQ(saved_state[i].first, loaded_state[i].first);
    EXPECT_TRUE(torch::equal(saved_state[i].second, loaded_state[i].second)) << saved_state[i].first;
  }

  // A truncated model file is caught by the manifest before anything is loaded.
  const auto model_file = fs::path(*store.latest()) / "model.safetensors";
  fs::resize_file(model_file, fs::file_size(model_file) / 2);
  const std::string message = message_of([&] { train::CheckpointStore::load_model(*store.latest(), other); });
  EXPECT_NE(message.find("model.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;

  // A model of another shape is refused with the tensor's name.
  struct Wide : torch::nn::Module {
    Wide() { fc = register_module("fc", torch::nn::Linear(5, 3)); }
    torch::nn::Linear fc{nullptr};
  } wide;
  const std::string shape_message =
      message_of([&] { train::CheckpointStore::load_model(train::checkpoint_folder(root, 20), wide); });
  EXPECT_NE(shape_message.find("fc.weight"), std::string::npos) << shape_message;
}

// Before: an I32 tensor in place of an F32 weight was cast silently (loss 6.5e10), and NaN weights
// loaded and evaluated to null.
TEST(CheckpointTest, WeightsOfAnotherKindOrNotFiniteAreRefusedNamingFileAndTensor) {
  const auto root = (temp_dir("ckpt_kinds") / "checkpoints").string();
  train::CheckpointStore store(root, dist::World::single()->world_group(), /*keep=*/5);
  OneLinear model;
  auto optimizer = adamw_for(model);
  const torch::Tensor bias = model.fc->bias.detach();
  store.save(1, {{"fc.weight", torch::ones({3, 4}, torch::kInt32)}, {"fc.bias", bias}}, *optimizer, {});
  torch::Tensor poisoned = model.fc->weight.detach().clone();
  poisoned[0][0] = std::numeric_limits<float>::quiet_NaN();
  store.save(2, {{"fc.weight", poisoned}, {"fc.bias", bias}}, *optimizer, {});
  OneLinear other;
  const std::string as_int = message_of([&] { train::CheckpointStore::load_model(train::checkpoint_folder(root, 1), other); });
  EXPECT_NE(as_int.find("'fc.weight' is stored as I32 but expected F32"), std::string::npos) << as_int;
  EXPECT_NE(as_int.find("model.safetensors"), std::string::npos) << as_int;
  const std::string as_nan = message_of([&] { train::CheckpointStore::load_model(train::checkpoint_folder(root, 2), other); });
  EXPECT_NE(as_nan.find("'fc.weight' holds 1 non-finite values"), std::string::npos) << as_nan;
}

}  // namespace
}  // namespace kuafu

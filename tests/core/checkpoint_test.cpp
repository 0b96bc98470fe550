// Safetensors and checkpoint folders: round trips, and every kind of damage refused with a message
// that names the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "core/util/error.h"

namespace kuafu {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("kuafu_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

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

struct Tiny : torch::nn::Module {
  Tiny() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
  }
  torch::nn::Linear fc{nullptr};
};

TEST(CheckpointTest, SaveLoadRoundTripAndDamageIsRefused) {
  const auto root = (temp_dir("ckpt") / "checkpoints").string();
  auto world = dist::World::single();
  train::CheckpointStore store(root, world->world_group(), /*keep=*/2);
  Tiny model;
  torch::optim::AdamW optimizer(model.parameters(), torch::optim::AdamWOptions(1e-3));
  model.fc->forward(torch::randn({2, 4})).sum().backward();
  optimizer.step();
  for (int64_t step : {10, 20, 30}) store.save(step, model, optimizer, {{"note", "x"}});
  ASSERT_TRUE(store.latest());
  EXPECT_EQ(*store.latest(), train::checkpoint_folder(root, 30));
  EXPECT_FALSE(fs::exists(train::checkpoint_folder(root, 10))) << "keep=2 must prune the oldest";

  Tiny other;
  torch::optim::AdamW other_optimizer(other.parameters(), torch::optim::AdamWOptions(1e-3));
  const auto state = train::CheckpointStore::load(*store.latest(), other, other_optimizer, 0);
  EXPECT_EQ(state.at("step"), 30);
  EXPECT_TRUE(torch::equal(other.fc->weight, model.fc->weight));

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

}  // namespace
}  // namespace kuafu

// Safetensors and checkpoint folders: round trips, and every kind of damage refused with a message
// that names the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/io/safetensors.h"
#include "core/optim/algorithms.h"
#include "core/train/checkpoint.h"
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

std::unique_ptr<optim::Optimizer> adamw_for(torch::nn::Module& model) {
  std::vector<optim::Param> params;
  for (const auto& item : model.named_parameters()) params.push_back({item.key(), item.value(), nullptr, true});
  auto optimizer = std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{{"all", params, {}}},
                                                  optim::AdamOptions{});
  optimizer->set_lr(1e-3);
  return optimizer;
}

TEST(CheckpointTest, SaveLoadRoundTripAndDamageIsRefused) {
  const auto root = (temp_dir("ckpt") / "checkpoints").string();
  auto world = dist::World::single();
  train::CheckpointStore store(root, world->world_group(), /*keep=*/2);
  Tiny model;
  auto optimizer = adamw_for(model);
  model.fc->forward(torch::randn({2, 4})).sum().backward();
  optimizer->step();
  for (int64_t step : {10, 20, 30}) store.save(step, train::named_weights(model), *optimizer, {{"note", "x"}});
  ASSERT_TRUE(store.latest());
  EXPECT_EQ(*store.latest(), train::checkpoint_folder(root, 30));
  EXPECT_FALSE(fs::exists(train::checkpoint_folder(root, 10))) << "keep=2 must prune the oldest";

  Tiny other;
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

}  // namespace
}  // namespace kuafu

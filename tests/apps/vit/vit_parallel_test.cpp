// ViT through the trainer under the strategies the shared runner applies to any hooks::BlockModel, from
// the config alone, against the serial run of the same global batches: Gemini over 2 data ranks (and
// its auto placement in bf16 against Gemini without placement), a 1F1B pipeline of 2 stages, and activation checkpointing (with dropout, so the
// recomputed forward must replay its masks). Plain SGD without clipping, so a gradient off by a factor
// shows in the weights; the per-step gradient norms are compared too. Tolerances as GPT's: 2e-5 on
// the weights, 1e-5 relative on the gradient norms (float32, only summation order differs).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <H5Cpp.h>
#include <nlohmann/json.hpp>

#include <random>

#include "apps/vit/commands.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "tests/support/multiprocess.h"
#include "tests/support/training_runs.h"
#include "tests/support/worker_world.h"

namespace kuafu::vit {
namespace {
namespace fs = std::filesystem;

constexpr int kSteps = 3;

// One folder per test, shared by the test process and the workers it starts.
fs::path test_root() {
  return testing::shared_test_dir("vit_parallel_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
}

// `n` random 28 x 28 gray images with labels i mod 10, as an HDF5 set: small, so every run's final
// evaluation takes a moment.
void write_images(const fs::path& path, int64_t n) {
  std::mt19937 rng(static_cast<unsigned>(n));
  std::vector<uint8_t> pixels(static_cast<size_t>(n * 28 * 28));
  for (auto& p : pixels) p = static_cast<uint8_t>(rng() % 256);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = i % 10;
  H5::H5File file(path.string(), H5F_ACC_TRUNC);
  const hsize_t image_dims[3] = {static_cast<hsize_t>(n), 28, 28}, label_dims[1] = {static_cast<hsize_t>(n)};
  file.createDataSet("images", H5::PredType::NATIVE_UINT8, H5::DataSpace(3, image_dims)).write(pixels.data(), H5::PredType::NATIVE_UINT8);
  file.createDataSet("labels", H5::PredType::NATIVE_INT64, H5::DataSpace(1, label_dims)).write(labels.data(), H5::PredType::NATIVE_INT64);
}

// The test's folder, emptied, with its image sets (the parent writes them; workers find them).
void prepare(const fs::path& root) {
  fs::remove_all(root);
  fs::create_directories(root);
  write_images(root / "train.h5", 64);
  write_images(root / "val.h5", 16);
}

// A 2-layer ViT on the test's images, 3 plain SGD steps of 8 images.
config::Config tiny_config(const fs::path& out, const std::vector<std::string>& extra) {
  const fs::path root = out.parent_path();
  std::vector<std::string> overrides = {
      "data.format=\"hdf5\"", "data.train=\"" + (root / "train.h5").string() + "\"",
      "data.val=\"" + (root / "val.h5").string() + "\"", "train.out_dir=\"" + out.string() + "\"", "train.progress=\"plain\"", "runtime.threads=1", "runtime.device=\"cpu\"",
      "train.steps=" + std::to_string(kSteps), "train.batch_size=8", "train.micro_batch_size=8",
      "train.eval_interval=0", "train.checkpoint_interval=0", "model.hidden_size=32", "model.num_hidden_layers=2",
      "model.num_attention_heads=2", "model.intermediate_size=64", "optim.name=\"sgd\"", "optim.momentum=0",
      "optim.weight_decay=0", "optim.grad_clip=0", "optim.lr=0.3", "optim.warmup_steps=0", "dist.timeout_s=60"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return config::Config::load((fs::path(KUAFU_SOURCE_DIR) / "apps/vit/configs/fashion_mnist_small.toml").string(),
                              vit_schema(), overrides);
}

void train_serially(const config::Config& config) {
  auto runtime = testing::single_runtime();
  auto task = make_image_task(config);
  train::Trainer(config, runtime, *task).run();
}

// Each worker joins its world once; every run of the test shares it.
void train_on_ranks(const config::Config& config) {
  static const std::shared_ptr<dist::World> world = testing::worker_world();
  train::Runtime runtime = train::start_runtime(config, world);
  auto task = make_image_task(config, runtime);
  train::Trainer(config, runtime, *task).run();
}

// The final checkpoints of `run` and `reference` hold the same weights (within `tolerance`) and their
// steps the same gradient norms (within tolerance / 2, relative).
void expect_same_training(const fs::path& run, const fs::path& reference, double tolerance = 2e-5) {
  const io::SafetensorsFile actual = testing::checkpoint_weights(run, kSteps);
  const io::SafetensorsFile expected = testing::checkpoint_weights(reference, kSteps);
  ASSERT_EQ(actual.tensors.size(), expected.tensors.size());
  for (const auto& [name, tensor] : expected.tensors) {
    const torch::Tensor* found = actual.find(name);
    ASSERT_TRUE(found) << name;
    EXPECT_LE((*found - tensor).abs().max().item<double>(), tolerance) << name;
  }
  const auto a = testing::grad_norms(run), b = testing::grad_norms(reference);
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tolerance / 2 * b[i]) << "step " << i + 1;
}

// float32 Gemini against the serial run; then in bf16 (where placement has masters apart from the
// compute chunks to place) the auto policy takes exactly Gemini's steps without placement: moving a
// chunk between tiers copies it and rounds nothing, so the tolerance there is 0.
TEST(ViTParallelTest, GeminiWithAutoPlacementOnTwoRanksEqualsSerial) {
  const fs::path root = test_root();
  if (!testing::is_worker()) {
    prepare(root);
    train_serially(tiny_config(root / "serial", {}));
    testing::run_test_on_ranks(2, 180);
    expect_same_training(root / "gemini", root / "serial");
    expect_same_training(root / "auto_bf16", root / "gemini_bf16", /*tolerance=*/0.0);
    return;
  }
  const std::vector<std::string> gemini = {"train.micro_batch_size=4", "memory.strategy=\"gemini\"",
                                           "memory.chunk_mb=0.01"};
  train_on_ranks(tiny_config(root / "gemini", gemini));
  std::vector<std::string> bf16 = gemini;
  bf16.push_back("precision.dtype=\"bf16\"");
  train_on_ranks(tiny_config(root / "gemini_bf16", bf16));
  bf16.push_back("memory.placement=\"auto\"");
  train_on_ranks(tiny_config(root / "auto_bf16", bf16));
}

// 4 micro-batches of 2 images through 2 stages of one layer each.
TEST(ViTParallelTest, PipelineOfTwoStagesEqualsSerial) {
  const fs::path root = test_root();
  if (!testing::is_worker()) {
    prepare(root);
    train_serially(tiny_config(root / "serial", {}));
    testing::run_test_on_ranks(2, 180);
    return expect_same_training(root / "pipeline", root / "serial");
  }
  train_on_ranks(tiny_config(root / "pipeline", {"train.micro_batch_size=2", "parallel.pipeline=2"}));
}

// Dropout on: the recomputation must draw the same masks as the forward it repeats.
TEST(ViTParallelTest, ActivationCheckpointingEqualsSerial) {
  const fs::path root = test_root();
  prepare(root);
  const std::vector<std::string> dropout = {"model.hidden_dropout_prob=0.1", "model.attention_probs_dropout_prob=0.1"};
  train_serially(tiny_config(root / "serial", dropout));
  std::vector<std::string> recomputed = dropout;
  recomputed.push_back("memory.activation_checkpointing=true");
  train_serially(tiny_config(root / "recomputed", recomputed));
  expect_same_training(root / "recomputed", root / "serial");
}

}  // namespace
}  // namespace kuafu::vit

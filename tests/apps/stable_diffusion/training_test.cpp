// Stable Diffusion training (kuafu-sd train / finetune) on the tiny pipeline of
// tests/python/diffusers_pipeline_reference.py:
// - the objective against diffusers' train_text_to_image.py step (tests/python/diffusers_training_reference.py):
//   the latents and text encodings it makes, the loss and UNet gradients for ε and v prediction, with and
//   without Min-SNR-5 (float32; 1e-5 on the loss, 1e-5 x the largest gradient entry);
// - the task's draws: a row's loss is the same whichever micro-batch computes it, caption drop-out gives
//   the empty caption's encoding (not zeros), the encoding cache gives the uncached loss;
// - the trainer: activation checkpointing, data parallelism, ZeRO-2 and Gemini over 2 Gloo ranks give the
//   serial run's SGD steps (the weights after plain SGD are the gradients; 2e-5), a resumed run's moving
//   average is the uninterrupted run's bitwise, and the exported pipeline folder loads in diffusers with
//   the moving average's weights and Kuafu's UNet output (1e-5);
// - textual inversion against diffusers' textual_inversion.py step (the tokenizer's ids, the loss and the concept
//   rows' gradients), its training under checkpointing and data parallelism, and its exported file through
//   diffusers' load_textual_inversion (SD 1.x and SDXL);
// - DreamBooth's prior preservation against train_dreambooth.py's objective, its class images and its steps
//   under checkpointing and data parallelism.
#include <gtest/gtest.h>

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "apps/stable_diffusion/class_images.h"
#include "apps/stable_diffusion/commands.h"
#include "apps/stable_diffusion/emoji_recipe.h"
#include "apps/stable_diffusion/lora_file.h"
#include "apps/stable_diffusion/new_pipeline.h"
#include "apps/stable_diffusion/textual_inversion_file.h"
#include "apps/stable_diffusion/vae_folder.h"
#include "apps/stable_diffusion/vae_training.h"
#include "apps/stable_diffusion/unet_folder.h"
#include "core/io/png_file.h"
#include "core/optim/optim_config.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "core/util/atomic_file.h"
#include "tests/support/multiprocess.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/training_runs.h"
#include "tests/support/worker_world.h"

namespace kuafu::sd {
namespace {
namespace fs = std::filesystem;

const testing::Reference& training_reference() {
  static const testing::Reference r = testing::build_reference("diffusers_training_reference.py", "sd_training");
  return r;
}

class DiffusionLossTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(DiffusionLossTest, IsDiffusersTrainingStep) {
  const auto& [prediction, gamma] = GetParam();
  const testing::Reference& ref = training_reference();
  Pipeline p = load_pipeline((ref.dir / "pipe").string());
  const auto posterior = p.vae->encode(ref["pixels"]);
  const torch::Tensor latents = posterior.sample(ref["posterior_noise"]) * p.vae->config.scaling_factor;
  EXPECT_LT(testing::max_abs_difference(latents, ref["latents"]), 1e-5);
  const torch::Tensor text = p.text_encoder->forward(p.tokenizer.encode(std::vector<std::string>{"a photo of the cat", ""})).last_hidden;
  EXPECT_LT(testing::max_abs_difference(text, ref["text"]), 1e-5);

  SchedulerConfig config = p.scheduler.config;
  config.prediction_type = prediction_named(prediction);
  const NoiseSchedule schedule(config);
  const torch::Tensor loss = diffusion_loss(p.unet, schedule, {ref["latents"], ref["text"], ref["noise"], ref["timesteps"], {}}, gamma);
  loss.backward();
  const std::string key = prediction + "_" + std::to_string(gamma);
  const double expected = ref[key + "_loss"].item<double>();
  EXPECT_NEAR(loss.item<double>(), expected, 1e-5 * expected);
  const auto params = p.unet->named_parameters();
  for (const char* name : {"conv_in.weight", "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight",
                           "mid_block.resnets.0.conv1.weight", "up_blocks.1.resnets.1.time_emb_proj.weight", "conv_out.bias",
                           "time_embedding.linear_1.weight"}) {
    const torch::Tensor& want = ref[key + "." + name];
    EXPECT_LT(testing::max_abs_difference(params[name].grad(), want), 1e-5 * want.abs().max().item<double>()) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(PredictionsAndWeights, DiffusionLossTest,
                         ::testing::Combine(::testing::Values("epsilon", "v_prediction"), ::testing::Values(0, 5)));

// Noise offset against train_text_to_image.py's --noise_offset 0.1 (one draw per row and channel, scaled, added to the
// noise, which is also the ε target): the same loss and gradients from the same draws (float32, 1e-5 as the plain
// step's); a row's draws differ with the offset on by amount x one value per channel, constant over the latent.
TEST(NoiseOffsetTest, IsTrainTextToImagesOffset) {
  const testing::Reference& ref = training_reference();
  Pipeline p = load_pipeline((ref.dir / "pipe").string());
  const torch::Tensor noise = offset_noise(ref["noise"], ref["offset_draws"], 0.1);
  const torch::Tensor loss = diffusion_loss(p.unet, NoiseSchedule(p.scheduler.config), {ref["latents"], ref["text"], noise, ref["timesteps"], {}});
  loss.backward();
  const double expected = ref["offset_loss"].item<double>();
  EXPECT_NEAR(loss.item<double>(), expected, 1e-5 * expected);
  for (const char* name : {"conv_in.weight", "mid_block.resnets.0.conv1.weight", "conv_out.bias"}) {
    const torch::Tensor& want = ref[std::string("offset.") + name];
    EXPECT_LT(testing::max_abs_difference(p.unet->named_parameters()[name].grad(), want), 1e-5 * want.abs().max().item<double>()) << name;
  }
  EXPECT_GT(std::abs(expected - ref["epsilon_0_loss"].item<double>()), 1e-4) << "the offset changes the loss";

  DiffusionSettings on;
  on.noise_offset = 0.1;
  const torch::Tensor shift = draw_row(3, 1, 2, {4, 8, 8}, 1000, on).noise - draw_row(3, 1, 2, {4, 8, 8}, 1000, DiffusionSettings{}).noise;
  const torch::Tensor per_channel = shift.amax({1, 2});  // [C]
  EXPECT_LT((shift - per_channel.view({4, 1, 1})).abs().max().item<double>(), 1e-6);
  EXPECT_GT(per_channel.abs().min().item<double>(), 1e-4);
}

// The VAE's objective: the decoded posterior sample's squared error and the KL per latent element are
// diffusers' (its DiagonalGaussianDistribution.kl() over the element count). Float32, 1e-5 relative.
TEST(VaeLossTest, IsTheReconstructionErrorAndDiffusersKl) {
  const testing::Reference& ref = training_reference();
  Pipeline p = load_pipeline((ref.dir / "pipe").string());
  torch::NoGradGuard no_grad;
  const VaeLosses l = vae_row_losses(p.vae, ref["pixels"], ref["posterior_noise"]);
  EXPECT_LT(testing::max_abs_difference(l.reconstruction, ref["vae_reconstruction"]), 1e-5 * ref["vae_reconstruction"].max().item<double>());
  EXPECT_LT(testing::max_abs_difference(l.kl, ref["vae_kl"]), 1e-5 * ref["vae_kl"].max().item<double>());
  EXPECT_NEAR(psnr_of(0.04), 20.0, 1e-12) << "peak-to-peak 2: 10 log10(4 / 0.04)";
}

// The UNet's analytic parameter count is its modules' (SD 1.x's and 2.x's block layouts, tiny widths).
TEST(UNetSizeTest, ParameterCountIsTheModulesCount) {
  UNetConfig c;
  c.block_out_channels = {16, 32, 32, 32};
  c.norm_num_groups = 8;
  c.cross_attention_dim = 24;
  c.heads = {2, 2, 2, 2};
  for (const std::string shape : {"SD 1.x", "SD 2.x", "SDXL"}) {
    c.use_linear_projection = shape != "SD 1.x";
    if (shape == "SDXL") {  // depths per block and the added conditioning's embedding
      c.transformer_depth = {1, 2, 3, 2};
      c.addition_embed_type = "text_time";
      c.addition_time_embed_dim = 8;
      c.projection_class_embeddings_input_dim = 20 + 6 * 8;
    }
    UNet2DCondition unet(c);
    int64_t modules = 0;
    for (const auto& p : unet->parameters()) modules += p.numel();
    EXPECT_EQ(c.parameter_count(), modules) << shape;
  }
}

// Widths, depths or a sample size no machine could hold (a config.json typo: 1e9) are refused when the config is read,
// before any module is built (they once overflowed LibTorch's size arithmetic or built until memory ran
// out); SD 1.5's 860M parameters pass.
TEST(UNetSizeTest, ASizeNoMachineHoldsIsRefusedBeforeBuilding) {
  UNetConfig c;
  c.block_out_channels = {1000000000, 1000000000};
  c.down_block_types = {"CrossAttnDownBlock2D", "DownBlock2D"};
  c.up_block_types = {"UpBlock2D", "CrossAttnUpBlock2D"};
  c.heads = {8, 8};
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { c.validate(); }), "parameters, more than any machine holds"));
  c.block_out_channels = {320, 640};
  c.layers_per_block = 1000000000;
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { c.validate(); }), "layers_per_block = 1000000000"));
  c.layers_per_block = 2;
  c.validate();
  c.sample_size = 1000000000;
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { c.validate(); }), "sample_size 1000000000 must lie in [1, 65536]"));
}

// Every shipped config loads, its learning-rate schedule too (benchmark_sd15.toml once set a rate below the
// default floor, which only the run refused); the benchmark's UNet (SD 1.5's unet/config.json, no weights) has the
// 859,520,964 parameters diffusers builds from that config (counted by diffusers on the meta device).
TEST(SdConfigsTest, EveryConfigLoadsAndTheBenchmarkUNetsAreSd15AndSdxlSized) {
  const fs::path configs = fs::path(KUAFU_SOURCE_DIR) / "apps/stable_diffusion/configs";
  int loaded = 0;
  for (const auto& entry : fs::directory_iterator(configs)) {
    if (entry.path().extension() != ".toml") continue;
    EXPECT_NO_THROW(optim::make_schedule(config::Config::load(entry.path().string(), sd_schema()), 100)) << entry.path();
    ++loaded;
  }
  EXPECT_GE(loaded, 3);
  const config::Config benchmark = config::Config::load((configs / "benchmark_sd15.toml").string(), sd_schema(),
                                                        {"model.pipeline=\"" + (configs / "sd15_unet").string() + "\""});
  EXPECT_EQ(make_sd_app(benchmark)->benchmark_size().parameters, 859520964.0);
  // SDXL base's UNet (stable-diffusion-xl-base-1.0's unet/config.json): diffusers counts 2,567,463,684 on the meta device.
  const config::Config sdxl = config::Config::load((configs / "benchmark_sdxl.toml").string(), sd_schema(),
                                                   {"model.pipeline=\"" + (configs / "sdxl_unet").string() + "\""});
  EXPECT_EQ(make_sd_app(sdxl)->benchmark_size().parameters, 2567463684.0);
}

// --- the task and the trainer on a tiny captioned image folder ---

// 8 training and 4 evaluation images (16 px, red or blue squares on grey) with captions, in <root>/images.
void write_images(const fs::path& root) {
  for (const auto& [split, count] : {std::pair{std::string("train"), 8}, std::pair{std::string("val"), 4}}) {
    for (int i = 0; i < count; ++i) {
      const std::string colour = i % 2 == 0 ? "red" : "blue";
      const fs::path folder = root / "images" / split / colour;
      fs::create_directories(folder);
      io::RgbImage image{16, 16, std::vector<uint8_t>(16 * 16 * 3, 128)};
      for (int y = 2 + i % 3; y < 12; ++y) {
        for (int x = 3; x < 13 - i % 4; ++x) image.pixels[static_cast<size_t>((y * 16 + x) * 3 + (i % 2 == 0 ? 0 : 2))] = 230;
      }
      const std::string stem = (folder / std::to_string(i)).string();
      io::write_png(stem + ".png", image);
      std::ofstream(stem + ".txt") << "a " << colour << " square, number " << i;
    }
  }
}

// The test's folder with the pipeline and images (the parent writes them; workers find them).
fs::path test_root() {
  return testing::shared_test_dir("sd_training_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
}

void prepare(const fs::path& root) {
  fs::remove_all(root);
  fs::create_directories(root);
  fs::copy(training_reference().dir / "pipe", root / "pipe", fs::copy_options::recursive);
  write_images(root);
}

constexpr int kSteps = 3;

// 3 plain SGD steps of 4 images (no clipping, no momentum: the weights move by the gradients).
config::Config tiny_config(const fs::path& root, const std::string& run, const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = {
      "model.pipeline=\"" + (root / "pipe").string() + "\"", "data.train=\"" + (root / "images/train").string() + "\"",
      "data.val=\"" + (root / "images/val").string() + "\"", "train.out_dir=\"" + (root / run).string() + "\"",
      "train.progress=\"plain\"", "runtime.threads=1", "runtime.device=\"cpu\"", "train.steps=" + std::to_string(kSteps),
      "train.batch_size=4", "train.micro_batch_size=4", "train.eval_interval=0", "train.checkpoint_interval=0",
      "diffusion.caption_dropout=0.25", "diffusion.min_snr_gamma=5", "diffusion.noise_offset=0.1", "optim.name=\"sgd\"",
      "optim.momentum=0", "optim.weight_decay=0", "optim.grad_clip=0", "optim.lr=0.5", "optim.warmup_steps=0", "dist.timeout_s=60"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return config::Config::from_string("", (root / (run + ".toml")).string(), sd_schema(), overrides);
}

std::unique_ptr<DiffusionTask> serial_task(const config::Config& config, std::unique_ptr<train::App>& app) {
  app = make_sd_app(config);
  std::unique_ptr<train::RunTask> task = app->make_task(parallel::ModelOptions::serial_on(torch::kCPU), nullptr);
  return std::unique_ptr<DiffusionTask>(dynamic_cast<DiffusionTask*>(task.release()));
}

// An empty or missing training folder is named as data.train (the evaluation set, labelled by the
// training folder's classes and once opened first, took the blame).
TEST(DiffusionTaskTest, AMissingTrainingSetIsNamedAsDataTrain) {
  const fs::path root = test_root();
  prepare(root);
  for (const std::string& train : std::vector<std::string>{"\"\"", "\"" + (root / "no_such_images").string() + "\""}) {
    const config::Config config = tiny_config(root, "run", {"data.train=" + train});
    std::unique_ptr<train::App> app;
    const std::string error = testing::expected_error([&] { serial_task(config, app); });
    EXPECT_TRUE(testing::Contains(error, "key 'data.train'")) << train;
    EXPECT_EQ(error.find("data.val"), std::string::npos) << error;
  }
}

// diffusion.cache encodes each image once, so a flip or a random crop drawn anew each epoch is refused with it,
// naming the key and what to set instead.
TEST(DiffusionTaskTest, TheCacheRefusesAugmentationItWouldFreeze) {
  const fs::path root = test_root();
  prepare(root);
  for (const auto& [augment, fix] : std::vector<std::pair<std::string, std::string>>{{"augment.flip=true", "augment.flip = false"},
                                                                                    {"augment.crop=\"random\"", "augment.crop = \"center\""}}) {
    std::unique_ptr<train::App> app;
    const std::string error = testing::expected_error([&] { serial_task(tiny_config(root, "run", {"diffusion.cache=true", augment}), app); });
    EXPECT_TRUE(testing::Contains(error, "key 'diffusion.cache'")) << error;
    EXPECT_TRUE(testing::Contains(error, fix)) << error;
  }
}

// The fit check counts the trained UNet and the frozen text encoder and VAE, each from its own section
// (the UNet's float32 AdamW state: 16 bytes a parameter; the frozen models' weights in their own dtype).
// Each count is the parameters of the model the pipeline folder loads as.
TEST(DiffusionTaskTest, TheFitCheckCountsTheUNetAndTheFrozenModelsFromTheirSections) {
  const fs::path root = test_root();
  prepare(root);
  const config::Config config = tiny_config(root, "run", {"optim.name=\"adamw\"", "models.text_encoder.precision.dtype=\"bf16\""});
  const train::ModelSize size = make_sd_app(config)->model_size();
  ASSERT_EQ(size.models.size(), 3u);
  const auto count = [](torch::nn::Module& module) {
    double n = 0;
    for (const auto& p : module.parameters()) n += static_cast<double>(p.numel());
    return n;
  };
  Pipeline pipeline = load_pipeline((root / "pipe").string(), torch::kCPU);
  EXPECT_EQ(size.models[0].name, "unet");
  EXPECT_TRUE(size.models[0].trained);
  EXPECT_EQ(size.models[0].parameters, count(*pipeline.unet));
  EXPECT_EQ(size.models[1].name, "text_encoder");
  EXPECT_FALSE(size.models[1].trained);
  EXPECT_EQ(size.models[1].parameters, count(*pipeline.text_encoder));
  EXPECT_EQ(size.models[2].name, "vae");
  EXPECT_FALSE(size.models[2].trained);
  EXPECT_EQ(size.models[2].parameters, count(*pipeline.vae));
  train::Runtime runtime = train::start_runtime(config, dist::World::single());
  const double expected = 16 * size.models[0].parameters + 2 * size.models[1].parameters + 4 * size.models[2].parameters;
  EXPECT_NEAR(train::least_run_bytes(config, runtime, size.models), expected, 1e-9 * expected);
}

// A row's draws come from (seed, step, row) alone, so one micro-batch of 4 and two of 2 give one loss.
TEST(DiffusionTaskTest, RowsDrawTheSameWhicheverMicroBatchHoldsThem) {
  const fs::path root = test_root();
  prepare(root);
  const config::Config config = tiny_config(root, "run", {});
  std::unique_ptr<train::App> app;
  auto task = serial_task(config, app);
  torch::NoGradGuard no_grad;
  const double whole = task->losses(1, 0, 4).at("unet").item<double>();
  const double halves = (task->losses(1, 0, 2).at("unet").item<double>() + task->losses(1, 2, 2).at("unet").item<double>()) / 2;
  EXPECT_NEAR(whole, halves, 1e-6 * whole);
  EXPECT_NE(whole, task->losses(2, 0, 4).at("unet").item<double>()) << "another step draws anew";
}

// Dropped captions train on the empty caption's CLIP encoding (what guidance pairs with at sampling),
// never on zeros; with diffusion.cache the encodings come from the cache and the loss is the same.
TEST(DiffusionTaskTest, DroppedCaptionsGetTheEmptyCaptionsEncoding) {
  const fs::path root = test_root();
  prepare(root);
  std::unique_ptr<train::App> app;
  auto task = serial_task(tiny_config(root, "run", {"diffusion.caption_dropout=1"}), app);
  torch::NoGradGuard no_grad;
  Pipeline& p = task->pipeline();
  const torch::Tensor empty = p.text_encoder->forward(p.tokenizer.encode(std::vector<std::string>{""})).last_hidden;  // [1, 77, D]
  const DiffusionSettings all_dropped{1.0, 0, 0, false};
  std::vector<RowDraws> draws;
  for (int64_t r = 0; r < 2; ++r) draws.push_back(draw_row(1, 0, r, {4, 8, 8}, 1000, all_dropped));
  ASSERT_TRUE(draws[0].drop_caption && draws[1].drop_caption);
  const DiffusionInputs dropped = task->inputs({0, 1}, draws, true, 0);
  EXPECT_GT(empty.abs().max().item<double>(), 0.1);
  EXPECT_EQ(testing::max_abs_difference(dropped.text, empty.expand({2, -1, -1})), 0.0);
  for (RowDraws& d : draws) d.drop_caption = false;
  const DiffusionInputs kept = task->inputs({0, 1}, draws, true, 0);
  const torch::Tensor captions =
      p.text_encoder->forward(p.tokenizer.encode(std::vector<std::string>{"a blue square, number 1", "a blue square, number 3"})).last_hidden;
  EXPECT_EQ(testing::max_abs_difference(kept.text, captions), 0.0);

  std::unique_ptr<train::App> cached_app, plain_app;
  auto cached = serial_task(tiny_config(root, "run", {"diffusion.cache=true"}), cached_app);
  auto plain = serial_task(tiny_config(root, "run", {}), plain_app);
  const double a = cached->losses(0, 0, 4).at("unet").item<double>(), b = plain->losses(0, 0, 4).at("unet").item<double>();
  EXPECT_NEAR(a, b, 1e-6 * b);
}

// An SDXL pipeline trains through the same task: each row's UNet input carries its caption's pooled text (a dropped
// caption's: the empty caption's, as its embeddings) and the time ids of its image as train_text_to_image_sdxl.py makes
// them (its original size, where the square was cut from it resized, the 16 x 16 training size), the cut anywhere along
// the longer side with augment.crop = "random"; the frozen second encoder is a run model of its own; cached encodings
// give the same loss.
TEST(DiffusionTaskTest, AnSdxlPipelineTrainsWithThePooledTextAndTimeIds) {
  const fs::path root = test_root();
  prepare(root);
  // Item 0 (blue/1) 24 x 40 pixels: its shorter side resized to 16, the longer to 26, the centre square cut at column 5.
  io::write_png((root / "images/train/blue/1.png").string(), io::RgbImage{40, 24, std::vector<uint8_t>(40 * 24 * 3, 90)});
  const fs::path sdxl = testing::build_reference("diffusers_sdxl_reference.py", "sdxl_pipeline").dir / "pipe";
  const std::string pipeline = "model.pipeline=\"" + sdxl.string() + "\"";
  std::unique_ptr<train::App> app;
  auto task = serial_task(tiny_config(root, "run", {pipeline}), app);
  Pipeline& p = task->pipeline();
  ASSERT_TRUE(p.sdxl());
  std::vector<std::string> names;
  for (const train::RunModel& m : task->models()) names.push_back(m.name);
  EXPECT_EQ(names, (std::vector<std::string>{"unet", "text_encoder", "vae", "text_encoder_2"}));
  torch::NoGradGuard no_grad;
  std::vector<RowDraws> draws;
  for (int64_t r = 0; r < 2; ++r) draws.push_back(draw_row(1, 0, r, {4, 8, 8}, 1000, DiffusionSettings{0.0, 0, 0, false}));
  draws[1].drop_caption = true;
  const DiffusionInputs in = task->inputs({0, 1}, draws, true, 0);
  // The task encodes the empty caption on its own and the batch's captions together; BLAS may pick other kernels
  // for other row counts (on some CPUs 4e-7 apart), so the same encodings within 1e-5, not bitwise.
  const PromptEmbeddings expected = encode_prompts(p, {"a blue square, number 1", ""});
  EXPECT_LT(testing::max_abs_difference(in.text, expected.text), 1e-5);
  EXPECT_LT(testing::max_abs_difference(in.added.text_embeds, expected.pooled), 1e-5);
  // train_text_to_image_sdxl.py's: (original height, width, crop top, left, 16, 16).
  EXPECT_EQ(testing::max_abs_difference(in.added.time_ids, torch::tensor({24.0, 40.0, 0.0, 5.0, 16.0, 16.0, 16.0, 16.0, 0.0, 0.0, 16.0, 16.0}).view({2, 6})),
            0.0);
  std::unique_ptr<train::App> random_app;
  auto random = serial_task(tiny_config(root, "run", {pipeline, "augment.crop=\"random\""}), random_app);
  std::set<double> lefts;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const torch::Tensor ids = random->inputs({0}, {draws[0]}, true, seed).added.time_ids;  // [1, 6]
    EXPECT_EQ(ids[0][2].item<double>(), 0.0);
    EXPECT_GE(ids[0][3].item<double>(), 0.0);
    EXPECT_LE(ids[0][3].item<double>(), 10.0);
    lefts.insert(ids[0][3].item<double>());
  }
  EXPECT_GT(lefts.size(), 1u) << "augment.crop = \"random\" cuts anywhere along the longer side";

  std::unique_ptr<train::App> cached_app, plain_app;
  auto cached = serial_task(tiny_config(root, "run", {pipeline, "diffusion.cache=true"}), cached_app);
  auto plain = serial_task(tiny_config(root, "run", {pipeline}), plain_app);
  const double a = cached->losses(0, 0, 4).at("unet").item<double>(), b = plain->losses(0, 0, 4).at("unet").item<double>();
  EXPECT_TRUE(std::isfinite(b));
  EXPECT_NEAR(a, b, 1e-6 * b);
}

// An unreadable training image (300 random bytes) among the 8 trains as the next readable one: its row's
// inputs are that image's, every step's loss is finite, and the cache (whose rows follow the items)
// gives the same losses. The task once drew noise for the missing row and stopped on "The size of
// tensor a (3) must match the size of tensor b (4)", so data.max_corrupt_images never helped.
TEST(DiffusionTaskTest, AnUnreadableImageTrainsAsTheNextReadableOne) {
  const fs::path root = test_root();
  prepare(root);
  std::ofstream(root / "images/train/red/0.png", std::ios::binary | std::ios::trunc) << std::string(300, '\x5a');
  const std::vector<std::string> no_dropout = {"diffusion.caption_dropout=0"};
  std::unique_ptr<train::App> app, cached_app;
  auto task = serial_task(tiny_config(root, "run", no_dropout), app);
  torch::NoGradGuard no_grad;
  // The items: blue 1, 3, 5, 7, then red 0 (unreadable), 2, 4, 6.
  const std::vector<RowDraws> draws{draw_row(1, 0, 0, {4, 8, 8}, 1000, DiffusionSettings{})};
  const DiffusionInputs unreadable = task->inputs({4}, draws, true, 7), next = task->inputs({5}, draws, true, 7);
  EXPECT_EQ(testing::max_abs_difference(unreadable.latents, next.latents), 0.0);
  EXPECT_EQ(testing::max_abs_difference(unreadable.text, next.text), 0.0);

  auto cached = serial_task(tiny_config(root, "run", {"diffusion.caption_dropout=0", "diffusion.cache=true"}), cached_app);
  for (int64_t step = 0; step < 2; ++step) {  // two steps of 4 cover the 8 images
    const double plain = task->losses(step, 0, 4).at("unet").item<double>();
    EXPECT_TRUE(std::isfinite(plain)) << "step " << step;
    EXPECT_NEAR(cached->losses(step, 0, 4).at("unet").item<double>(), plain, 1e-6 * plain) << "step " << step;
  }
}

void train_on_ranks(const config::Config& config) {
  static const std::shared_ptr<dist::World> world = testing::worker_world();
  train::Runtime runtime = train::start_runtime(config, world);
  std::unique_ptr<train::App> app = make_sd_app(config);
  std::unique_ptr<train::RunTask> task = app->make_task(runtime.model_options(), &runtime);
  train::Trainer(config, runtime, *task).run();
}

// Each step's gradient norm of the trained model `part` ("unet", textual inversion's "tokens").
std::vector<double> unet_grad_norms(const fs::path& run, const std::string& part = "unet") {
  std::vector<double> norms;
  for (const auto& line : testing::metric_lines(run / "metrics.jsonl")) norms.push_back(line.at(part + ".grad_norm").get<double>());
  return norms;
}

void expect_same_steps(const fs::path& root, const std::string& run, const std::string& reference_run, const std::string& part = "unet") {
  testing::expect_same_tensors(testing::saved(root, run, part + ".model.safetensors", kSteps),
                               testing::saved(root, reference_run, part + ".model.safetensors", kSteps), 2e-5, 1e-3, run);
  const auto a = unet_grad_norms(root / run, part), b = unet_grad_norms(root / reference_run, part);
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps)) << run;
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * b[i]) << run << " step " << i + 1;
}

// `overrides` and `more`.
std::vector<std::string> joined(std::vector<std::string> overrides, const std::vector<std::string>& more) {
  overrides.insert(overrides.end(), more.begin(), more.end());
  return overrides;
}

// The serial run ("serial") and the same under activation checkpointing ("checkpointed"), each with `overrides`.
void train_serial_and_checkpointed(const fs::path& root, const std::vector<std::string>& overrides) {
  for (const auto& [run, checkpointing] : std::vector<std::pair<std::string, std::string>>{
           {"serial", "memory.activation_checkpointing=false"}, {"checkpointed", "memory.activation_checkpointing=true"}}) {
    const config::Config config = tiny_config(root, run, joined(overrides, {checkpointing}));
    train::train_app(*make_sd_app(config), config);
  }
}

TEST(DiffusionTrainingTest, EveryStrategyTakesTheSerialSteps) {
  const fs::path root = test_root();
  if (!testing::is_worker()) {
    prepare(root);
    train::train_app(*make_sd_app(tiny_config(root, "serial", {})), tiny_config(root, "serial", {}));
    const config::Config checkpointed = tiny_config(root, "checkpointed", {"memory.activation_checkpointing=true"});
    train::train_app(*make_sd_app(checkpointed), checkpointed);
    // The UNet's own section decides how it is built, as it decides how it trains (the top-level
    // strategy once left it described with nothing to fill it, and the run was refused).
    const config::Config sectioned =
        tiny_config(root, "unet_section", {"memory.strategy=\"zero2\"", "models.unet.memory.strategy=\"none\""});
    train::train_app(*make_sd_app(sectioned), sectioned);
    testing::run_test_on_ranks(2, 300);
    ASSERT_GT(unet_grad_norms(root / "serial").at(0), 0.0);
    for (const char* run : {"checkpointed", "unet_section", "data", "zero2", "gemini"}) expect_same_steps(root, run, "serial");
    return;
  }
  train_on_ranks(tiny_config(root, "data", {"train.micro_batch_size=2"}));
  train_on_ranks(tiny_config(root, "zero2", {"train.micro_batch_size=2", "memory.strategy=\"zero2\""}));
  train_on_ranks(tiny_config(root, "gemini", {"train.micro_batch_size=1", "memory.strategy=\"gemini\"", "memory.chunk_mb=0.05",
                                              "memory.activation_checkpointing=true"}));
}

// An SDXL pipeline under the strategies: its added conditioning's embedding rides the time embedding's block, which
// ZeRO-2 and Gemini (with activation checkpointing) gather and free as any other; data parallelism, ZeRO-2 and Gemini
// on 2 Gloo ranks take the serial run's 3 SGD steps (the same bounds as SD 1.x's above).
TEST(DiffusionTrainingTest, AnSdxlPipelineTakesTheSerialStepsUnderEveryStrategy) {
  const fs::path root = test_root();
  const std::string pipeline = "model.pipeline=\"" + (root / "sdxl_pipe").string() + "\"";
  if (!testing::is_worker()) {
    prepare(root);
    fs::copy(testing::build_reference("diffusers_sdxl_reference.py", "sdxl_pipeline").dir / "pipe", root / "sdxl_pipe",
             fs::copy_options::recursive);
    const config::Config serial = tiny_config(root, "serial", {pipeline});
    train::train_app(*make_sd_app(serial), serial);
    testing::run_test_on_ranks(2, 300);
    ASSERT_GT(unet_grad_norms(root / "serial").at(0), 0.0);
    for (const char* run : {"data", "zero2", "gemini"}) expect_same_steps(root, run, "serial");
    return;
  }
  train_on_ranks(tiny_config(root, "data", {pipeline, "train.micro_batch_size=2"}));
  train_on_ranks(tiny_config(root, "zero2", {pipeline, "train.micro_batch_size=2", "memory.strategy=\"zero2\""}));
  train_on_ranks(tiny_config(root, "gemini", {pipeline, "train.micro_batch_size=1", "memory.strategy=\"gemini\"", "memory.chunk_mb=0.05",
                                              "memory.activation_checkpointing=true"}));
}

// Aspect-ratio buckets on the SDXL pipeline (16 px; sides divide by 4): buckets.step = 4 gives 32x8 ... 8x32. Items
// 0 and 1 (blue/1, blue/3) are 40 x 24 (width x height), 20x12's ratio: trained whole, uncut, their time ids
// (24, 40, 0, 0, 12, 20) as kohya gives a bucket's; item 4 (red/0) 12 x 36 is 8x24's; the other five stay in the
// square. In batches of 4: 1 + 1 + 2 steps an epoch, each of one bucket, every image seen. The cache gives the
// uncached losses; the evaluation takes its images in their buckets; DreamBooth's square class images go beside
// a wide step's rows; a step the pipeline cannot take is named.
TEST(DiffusionTaskTest, BucketsTrainEachImageWholeInItsAspectBucket) {
  const fs::path root = test_root();
  prepare(root);
  for (const char* name : {"blue/1.png", "blue/3.png"}) {
    io::write_png((root / "images/train" / name).string(), io::RgbImage{40, 24, std::vector<uint8_t>(40 * 24 * 3, 90)});
  }
  io::write_png((root / "images/train/red/0.png").string(), io::RgbImage{12, 36, std::vector<uint8_t>(12 * 36 * 3, 200)});
  io::write_png((root / "images/val/blue/1.png").string(), io::RgbImage{40, 24, std::vector<uint8_t>(40 * 24 * 3, 60)});
  const fs::path sdxl = testing::build_reference("diffusers_sdxl_reference.py", "sdxl_pipeline").dir / "pipe";
  const std::vector<std::string> bucketed = {"model.pipeline=\"" + sdxl.string() + "\"", "buckets.enable=true", "buckets.step=4"};
  std::unique_ptr<train::App> app;
  auto task = serial_task(tiny_config(root, "run", bucketed), app);
  ASSERT_EQ(task->buckets(), (std::vector<io::ImageSize>{{32, 8}, {28, 8}, {24, 8}, {20, 12}, {16, 16}, {12, 20}, {8, 24}, {8, 28}, {8, 32}}));
  ASSERT_EQ(task->steps_per_epoch(), 4);
  torch::NoGradGuard no_grad;
  const std::vector<RowDraws> wide_draws = {draw_row(1, 0, 0, {4, 6, 10}, 1000, DiffusionSettings{}),
                                            draw_row(1, 0, 1, {4, 6, 10}, 1000, DiffusionSettings{})};
  const DiffusionInputs wide = task->inputs({0, 1}, wide_draws, true, 0);
  EXPECT_EQ(wide.latents.sizes(), (std::vector<int64_t>{2, 4, 6, 10}));
  EXPECT_EQ(testing::max_abs_difference(wide.added.time_ids, torch::tensor({24.0, 40.0, 0.0, 0.0, 12.0, 20.0}).repeat({2, 1})), 0.0);
  const DiffusionInputs tall = task->inputs({4}, {draw_row(1, 0, 0, {4, 12, 4}, 1000, DiffusionSettings{})}, true, 0);
  EXPECT_EQ(testing::max_abs_difference(tall.added.time_ids, torch::tensor({36.0, 12.0, 0.0, 0.0, 24.0, 8.0}).view({1, 6})), 0.0);

  std::unique_ptr<train::App> cached_app;
  auto cached = serial_task(tiny_config(root, "run", joined(bucketed, {"diffusion.cache=true"})), cached_app);
  for (int64_t step = 0; step < 4; ++step) {
    const double a = task->losses(step, 0, 4).at("unet").item<double>(), b = cached->losses(step, 0, 4).at("unet").item<double>();
    EXPECT_TRUE(std::isfinite(a)) << step;
    EXPECT_NEAR(b, a, 1e-5 * a) << "step " << step;
  }
  const train::LossSum eval = task->evaluate(0, 1);
  EXPECT_EQ(eval.count, 4.0);
  EXPECT_TRUE(std::isfinite(eval.loss_sum));

  fs::create_directories(root / "classes/class");
  for (int n = 0; n < 2; ++n) {
    io::write_png((root / "classes/class" / (std::to_string(n) + ".png")).string(), io::RgbImage{16, 16, std::vector<uint8_t>(16 * 16 * 3, 40)});
    std::ofstream(root / "classes/class" / (std::to_string(n) + ".txt")) << "a square";
  }
  const std::vector<std::string> dreambooth = {"dreambooth.class_data=\"" + (root / "classes").string() + "\"",
                                               "dreambooth.class_prompt=\"a square\"", "dreambooth.class_images=2"};
  for (const double weight : {0.0, 1.0}) {
    std::unique_ptr<train::App> prior_app;
    auto prior = serial_task(tiny_config(root, "run", joined(bucketed, joined(dreambooth, {"dreambooth.prior_loss_weight=" + std::to_string(weight)}))),
                             prior_app);
    for (int64_t step = 0; step < 4; ++step) {
      const double with_prior = prior->losses(step, 0, 4).at("unet").item<double>(), plain = task->losses(step, 0, 4).at("unet").item<double>();
      if (weight == 0) {
        EXPECT_NEAR(with_prior, plain, 1e-6 * plain) << "step " << step;
      } else {
        EXPECT_GT(with_prior, plain) << "step " << step;
      }
    }
  }
  std::unique_ptr<train::App> bad_app;
  const std::string error = testing::expected_error([&] { serial_task(tiny_config(root, "run", joined(bucketed, {"buckets.step=6"})), bad_app); });
  EXPECT_TRUE(testing::Contains(error, "buckets.step"));
  EXPECT_TRUE(testing::Contains(error, "6 is not a multiple of 4"));
  const std::string sides = testing::expected_error([&] { serial_task(tiny_config(root, "run", joined(bucketed, {"buckets.min_side=20"})), bad_app); });
  EXPECT_TRUE(testing::Contains(sides, "buckets.min_side (20) <= the resolution (16)"));
  const std::string vae = testing::expected_error([&] { read_sd_settings(tiny_config(root, "run", joined(bucketed, {"model.train=\"vae\""}))); });
  EXPECT_TRUE(testing::Contains(vae, "the VAE trains on squares"));
}

// Aspect-ratio buckets (two wide images, one tall, five square; buckets.step = 4) under activation checkpointing and
// 2-rank Gloo data parallelism take the serial run's 3 SGD steps: each step's rows share one bucket, whichever rank
// or micro-batch holds them.
TEST(DiffusionTrainingTest, BucketedTrainingTakesTheSerialStepsUnderCheckpointingAndDataParallelism) {
  const fs::path root = test_root();
  const std::vector<std::string> bucketed = {"buckets.enable=true", "buckets.step=4", "augment.crop=\"random\"", "augment.flip=true"};
  if (!testing::is_worker()) {
    prepare(root);
    for (const char* name : {"blue/1.png", "blue/3.png"}) {
      io::write_png((root / "images/train" / name).string(), io::RgbImage{40, 24, std::vector<uint8_t>(40 * 24 * 3, 90)});
    }
    io::write_png((root / "images/train/red/0.png").string(), io::RgbImage{12, 30, std::vector<uint8_t>(12 * 30 * 3, 200)});
    train_serial_and_checkpointed(root, bucketed);
    testing::run_test_on_ranks(2, 300);
    ASSERT_GT(unet_grad_norms(root / "serial").at(0), 0.0);
    for (const char* run : {"checkpointed", "data"}) expect_same_steps(root, run, "serial");
    return;
  }
  train_on_ranks(tiny_config(root, "data", joined(bucketed, {"train.micro_batch_size=1"})));
}

// The UNet's output on fixed inputs (saved as `inputs` for the Python side): [2, 4, 8, 8].
struct UNetProbe {
  torch::Tensor sample, timesteps, text;
  explicit UNetProbe(const fs::path& inputs) {
    torch::manual_seed(3);
    sample = torch::randn({2, 4, 8, 8});
    timesteps = torch::tensor({5, 640});
    text = torch::randn({2, 77, 12});
    io::save_safetensors(inputs.string(), {{"sample", sample}, {"timesteps", timesteps}, {"text", text}});
  }
  torch::Tensor operator()(UNet2DConditionImpl& unet) const {
    torch::NoGradGuard no_grad;
    return unet.forward(sample, timesteps, text);
  }
};

// What the Python side samples against: 4 steps at guidance 3 from seeded initial latents of `shape` [B, 4, h, w],
// which it also reads from `latents` (safetensors, "latents").
SampleOptions four_steps_from(const std::vector<int64_t>& shape, uint64_t seed, const fs::path& latents) {
  SampleOptions options;
  options.steps = 4;
  options.guidance = 3.0;
  torch::manual_seed(seed);
  options.initial_latents = torch::randn(shape);
  io::save_safetensors(latents.string(), {{"latents", options.initial_latents}});
  return options;
}

// `export` of the run `config` twice: root/adapter with --adapter, root/merged as a whole pipeline folder.
void export_adapter_and_merged(const config::Config& config, const fs::path& root) {
  config::ParsedCommand command;
  command.options = {{"out", (root / "adapter").string()}, {"checkpoint", ""}};
  command.flags = {"adapter"};
  train::export_app(*make_sd_app(config), config, command);
  command.options["out"] = (root / "merged").string();
  command.flags.clear();
  train::export_app(*make_sd_app(config), config, command);
}

// `ours` against what `script`'s lora_sample samples from <root>/lora_latents.safetensors with <root>/adapter loaded
// into `pipe` by diffusers' load_lora_weights and with the merged folder <root>/merged: within 1e-4 × the latents'
// largest, which it returns.
double expect_exports_sample_as(const torch::Tensor& ours, const std::string& script, const fs::path& pipe, const fs::path& root,
                                const std::string& label) {
  const fs::path out = root / "lora_sample.safetensors";
  const testing::PythonRun run = testing::run_python_reference(
      script, "lora_sample " + pipe.string() + " " + (root / "adapter").string() + " " + (root / "merged").string() + " " +
                  (root / "lora_latents.safetensors").string() + " " + out.string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const io::SafetensorsFile theirs = io::load_safetensors(out.string());
  const double bound = 1e-4 * theirs.find("diffusers")->abs().max().item<double>();
  for (const char* loader : {"diffusers", "merged"}) {
    const double difference = testing::max_abs_difference(ours, *theirs.find(loader));
    EXPECT_LT(difference, bound) << loader;
    std::cout << label << ", " << loader << ": latents within " << difference << " (bound " << bound << ")\n";
  }
  return bound;
}

torch::Tensor python_output(const std::string& command, const fs::path& out, const std::string& key) {
  const testing::PythonRun run = testing::run_python_reference("diffusers_training_reference.py", command + " " + out.string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return *io::load_safetensors(out.string()).find(key);
}

// AdamW with a moving average (decay 0.9) over 4 steps, checkpoints every 2: the run resumed from step 2
// ends with the uninterrupted run's weights and moving average, bit for bit. Its export is a pipeline
// folder diffusers loads, whose UNet is the moving average and computes what Kuafu's does.
TEST(DiffusionTrainingTest, MovingAverageResumesExactlyAndExportsToDiffusers) {
  const fs::path root = test_root();
  prepare(root);
  auto config = [&](const std::string& run) {
    return tiny_config(root, run, {"optim.name=\"adamw\"", "optim.lr=1e-3", "optim.ema_decay=0.9", "train.steps=4",
                                   "train.checkpoint_interval=2", "train.keep_checkpoints=3"});
  };
  train::train_app(*make_sd_app(config("straight")), config("straight"));
  train::train_app(*make_sd_app(config("resumed")), config("resumed"));
  const fs::path checkpoints = root / "resumed" / "checkpoints";
  fs::remove_all(train::checkpoint_folder(checkpoints.string(), 4));
  write_file_atomic((checkpoints / "latest").string(), "step_00000002\n");
  train::train_app(*make_sd_app(config("resumed")), config("resumed"));
  for (const char* file : {"unet.model.safetensors", "unet.ema.model.safetensors"}) {
    testing::expect_same_tensors(testing::saved(root, "resumed", file, 4), testing::saved(root, "straight", file, 4), 0.0, 1.0, file);
  }
  const io::SafetensorsFile ema = testing::saved(root, "straight", "unet.ema.model.safetensors", 4);
  const io::SafetensorsFile live = testing::saved(root, "straight", "unet.model.safetensors", 4);
  EXPECT_GT(testing::max_abs_difference(ema.tensors.begin()->second, live.find(ema.tensors.begin()->first)->clone()), 0.0);

  const config::Config straight = config("straight");
  config::ParsedCommand command;
  command.options["out"] = (root / "exported").string();
  command.options["checkpoint"] = "";  // the latest
  train::export_app(*make_sd_app(straight), straight, command);
  Pipeline exported = load_pipeline((root / "exported").string());
  for (const auto& item : exported.unet->named_parameters()) {
    ASSERT_TRUE(ema.find(item.key())) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), *ema.find(item.key()))) << item.key();
  }
  const UNetProbe probe(root / "inputs.safetensors");
  const torch::Tensor theirs = python_output("unet_output " + (root / "exported").string() + " " + (root / "inputs.safetensors").string(),
                                             root / "out.safetensors", "output");
  EXPECT_LT(testing::max_abs_difference(probe(*exported.unet), theirs), 1e-5);
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { train::export_app(*make_sd_app(straight), straight, command); }),
                                "already exists"));
}

// Evaluations every 2 steps with samples: the evaluation runs on the moving average (the step-4 loss is
// the one the moving average, loaded alone, gives: 1e-6 relative, the same float32 sums), the live weights
// come back bit for bit (the run ends where the run without evaluations does), and each evaluation's
// samples are the exported moving average's samples from the same noise (pixels within 1 of 255: the
// run samples in training order of operations, the same float32 maths).
TEST(DiffusionTrainingTest, EvaluationAndSamplesUseTheMovingAverage) {
  const fs::path root = test_root();
  prepare(root);
  auto config = [&](const std::string& run, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"optim.name=\"adamw\"", "optim.lr=1e-3", "optim.ema_decay=0.9", "train.steps=4",
                               "train.checkpoint_interval=4", "train.eval_rows=4"});
    return tiny_config(root, run, extra);
  };
  const config::Config plain = config("plain", {});
  const config::Config evaluated = config("evaluated", {"train.eval_interval=2", "sample.prompts=[\"a red square\", \"a blue square\"]",
                                                        "sample.steps=3", "sample.guidance=3", "sample.seed=7"});
  train::train_app(*make_sd_app(plain), plain);
  train::train_app(*make_sd_app(evaluated), evaluated);
  for (const char* file : {"unet.model.safetensors", "unet.ema.model.safetensors", "unet.optimizer.safetensors"}) {
    testing::expect_same_tensors(testing::saved(root, "evaluated", file, 4), testing::saved(root, "plain", file, 4), 0.0, 1.0, file);
  }

  double last_val_loss = -1;
  std::ifstream metrics(root / "evaluated" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json json = nlohmann::json::parse(line);
    if (json.contains("val_loss") && json.at("step") == 4) last_val_loss = json.at("val_loss").get<double>();
  }
  std::unique_ptr<train::App> app;
  std::unique_ptr<DiffusionTask> task = serial_task(evaluated, app);
  train::load_checkpoint_weights(evaluated, "", *task->pipeline().unet, "unet.ema");
  task->pipeline().unet->eval();
  const train::LossSum ema_sums = task->evaluate(0, 1);
  EXPECT_NEAR(last_val_loss, ema_sums.loss_sum / ema_sums.count, 1e-6 * last_val_loss);

  config::ParsedCommand command;
  command.options = {{"out", (root / "exported").string()}, {"checkpoint", ""}};
  train::export_app(*make_sd_app(evaluated), evaluated, command);
  Pipeline exported = load_pipeline((root / "exported").string());
  SampleOptions options;
  options.steps = 3;
  options.guidance = 3;
  options.seed = 7;
  const torch::Tensor expected = sample(exported, {"a red square", "a blue square"}, options).images;  // [2, 3, 16, 16]
  const cv::Mat written = cv::imread((root / "evaluated/samples/step_00000004.png").string(), cv::IMREAD_COLOR);  // BGR
  ASSERT_EQ(written.rows, 16);
  ASSERT_EQ(written.cols, 32);
  const torch::Tensor pixels = torch::from_blob(written.data, {16, 32, 3}, torch::kUInt8).flip(2).to(torch::kFloat32);  // [H, 2W, RGB]
  const torch::Tensor expected_pixels = (expected * 255).round().permute({2, 0, 3, 1}).reshape({16, 32, 3});
  EXPECT_LE((pixels - expected_pixels).abs().max().item<double>(), 1.0);
  EXPECT_TRUE(fs::exists(root / "evaluated/samples/step_00000002.png"));
  bool has_step = false;
  for (const auto& [key, value] : io::read_png_text((root / "evaluated/samples/step_00000004.png").string())) {
    has_step = has_step || (key == "training step" && value == "4");
  }
  EXPECT_TRUE(has_step) << "the PNG names the training step";
}

// LoRA on the UNet's attention projections (to_q, to_k, to_v, to_out.0; r 4, alpha 8). Under activation
// checkpointing its SGD steps are the unchecked run's (2e-5), and only the adapters move. After AdamW
// steps with a moving average (of the adapters alone, over the frozen weights) the adapter folder loads
// with diffusers' load_lora_weights and with peft's PeftModel, its kohya file with load_lora_weights and with
// Kuafu's own merge (`sample --lora`), and the merged pipeline folder with from_pretrained, each giving
// Kuafu's adapted UNet's output (1e-5).
TEST(DiffusionTrainingTest, LoraTrainsUnderCheckpointingAndRoundTripsThroughDiffusersAndPeft) {
  const fs::path root = test_root();
  prepare(root);
  const std::vector<std::string> lora = {"lora.rank=4", "lora.alpha=8"};
  for (const auto& [run, extra] : std::vector<std::pair<std::string, std::string>>{{"lora", "memory.activation_checkpointing=false"},
                                                                                     {"lora_checkpointed", "memory.activation_checkpointing=true"}}) {
    std::vector<std::string> overrides = lora;
    overrides.push_back(extra);
    const config::Config config = tiny_config(root, run, overrides);
    train::train_app(*make_sd_app(config), config);
  }
  expect_same_steps(root, "lora_checkpointed", "lora");
  const io::SafetensorsFile trained = testing::saved(root, "lora", "unet.model.safetensors", kSteps);
  UNet2DCondition original = load_unet((root / "pipe/unet").string());
  EXPECT_TRUE(torch::equal(*trained.find("conv_in.weight"), original->conv_in->weight)) << "a frozen weight moved";
  EXPECT_GT(trained.find("mid_block.attentions.0.transformer_blocks.0.attn2.to_k.lora_B.weight")->abs().max().item<double>(), 0.0);

  std::vector<std::string> adam = lora;
  adam.insert(adam.end(), {"optim.name=\"adamw\"", "optim.lr=1e-2", "optim.ema_decay=0.5"});
  const config::Config config = tiny_config(root, "lora_adam", adam);
  train::train_app(*make_sd_app(config), config);
  export_adapter_and_merged(config, root);

  const UNetProbe probe(root / "inputs.safetensors");
  std::unique_ptr<train::App> app = make_sd_app(config);
  auto& adapted = dynamic_cast<UNet2DConditionImpl&>(app->build_model(torch::kCPU, true));
  ASSERT_EQ(app->model_part(), "unet.ema") << "exports take the moving average (of the adapters alone)";
  train::load_checkpoint_weights(config, "", adapted, app->model_part());
  const torch::Tensor mine = probe(adapted);
  const std::string inputs = (root / "inputs.safetensors").string();
  for (const char* loader : {"diffusers", "peft", "kohya"}) {
    const torch::Tensor theirs = python_output("lora_outputs " + (root / "pipe").string() + " " + (root / "adapter").string() + " " + inputs,
                                               root / "lora_out.safetensors", loader);
    EXPECT_LT(testing::max_abs_difference(mine, theirs), 1e-5) << loader;
  }
  const torch::Tensor merged = python_output("unet_output " + (root / "merged").string() + " " + inputs, root / "merged_out.safetensors", "output");
  EXPECT_LT(testing::max_abs_difference(mine, merged), 1e-5);
  Pipeline with_kohya = load_pipeline((root / "pipe").string());  // the kohya file as `sample --lora` merges it
  int64_t adapted_layers = 0;
  for (const auto& item : adapted.named_parameters()) adapted_layers += item.key().find(".lora_A.") != std::string::npos;
  EXPECT_EQ(merge_kohya_lora(with_kohya, (root / "adapter" / kKohyaLoraFile).string(), 1.0), adapted_layers) << "every adapted layer";
  EXPECT_LT(testing::max_abs_difference(mine, probe(*with_kohya.unet)), 1e-5);
  EXPECT_GT(testing::max_abs_difference(mine, probe(*original)), 1e-3) << "the adapters changed the output";
}

// lora.text_encoder: the text encoder's attention projections get adapters beside the UNet's (r 4, α 8) and train
// with them (AdamW, moving average), its base frozen. The adapter folder through diffusers' load_lora_weights (UNet
// and text encoder), its kohya file (lora_unet_*, lora_te_*) through Kuafu's merge, and the merged pipeline folder
// through from_pretrained each sample (DDIM-4, guidance 3, from the same latents) as Kuafu's pipeline with the
// checkpoint's adapters (1e-4 x the latents' largest value, as the pipeline tests).
TEST(DiffusionTrainingTest, TextEncoderLoraTrainsAndItsExportsSampleAsDiffusers) {
  const fs::path root = test_root();
  prepare(root);
  const config::Config config = tiny_config(root, "te_lora", {"lora.rank=4", "lora.alpha=8", "lora.text_encoder=true", "optim.name=\"adamw\"",
                                                              "optim.lr=1e-2", "optim.ema_decay=0.5"});
  train::train_app(*make_sd_app(config), config);
  const io::SafetensorsFile text = testing::saved(root, "te_lora", "text_encoder.model.safetensors", kSteps);
  Pipeline original = load_pipeline((root / "pipe").string());
  const auto base = original.text_encoder->named_parameters();
  int64_t adapters = 0;
  for (const auto& [name, tensor] : text.tensors) {
    if (nn::is_lora_parameter(name)) {
      adapters += name.find(".lora_B.") != std::string::npos && tensor.abs().max().item<double>() > 0;
    } else {
      ASSERT_NE(base.find(name), nullptr) << name;
      EXPECT_TRUE(torch::equal(tensor, *base.find(name))) << name << ": a frozen weight moved";
    }
  }
  EXPECT_EQ(adapters, 2 * 4) << "every adapted projection (2 layers x q, k, v, out) moved from its zero lora_B";

  export_adapter_and_merged(config, root);

  // Kuafu's pipeline with the checkpoint's moving averages of both models' adapters.
  Pipeline mine = load_pipeline((root / "pipe").string());
  const nn::LoraSpec spec{4, 8, 0, {"to_q", "to_k", "to_v", "to_out.0"}, std::nullopt};
  nn::apply_lora(*mine.unet, spec);
  nn::apply_lora(*mine.text_encoder, text_encoder_lora_spec(spec));
  train::load_checkpoint_weights(config, "", *mine.unet, "unet.ema");
  train::load_checkpoint_weights(config, "", *mine.text_encoder, "text_encoder.ema");
  const SampleOptions options = four_steps_from({2, 4, 8, 8}, 6, root / "lora_latents.safetensors");
  const std::vector<std::string> prompts = {"a red square, number 1", "a blue square"};
  const torch::Tensor ours = sample(mine, prompts, options).latents;
  const double bound = expect_exports_sample_as(ours, "diffusers_training_reference.py", root / "pipe", root, "text-encoder LoRA");
  Pipeline with_kohya = load_pipeline((root / "pipe").string());
  int64_t adapted_layers = 0;
  for (const auto& item : mine.unet->named_parameters()) adapted_layers += item.key().find(".lora_A.") != std::string::npos;
  EXPECT_EQ(merge_kohya_lora(with_kohya, (root / "adapter" / kKohyaLoraFile).string(), 1.0), adapted_layers + 2 * 4)
      << "every UNet layer and the 8 text ones";
  EXPECT_LT(testing::max_abs_difference(ours, sample(with_kohya, prompts, options).latents), bound);
  Pipeline unet_only = load_pipeline((root / "pipe").string());
  nn::apply_lora(*unet_only.unet, spec);
  train::load_checkpoint_weights(config, "", *unet_only.unet, "unet.ema");
  EXPECT_GT(testing::max_abs_difference(ours, sample(unet_only, prompts, options).latents), 10 * bound) << "the text encoder's adapters count";
}

// SDXL with text-encoder LoRA: both encoders' adapters train beside the UNet's; the adapter folder through diffusers'
// load_lora_weights (text_encoder. and text_encoder_2. keys), the merged pipeline folder, and the kohya file
// (lora_unet_, lora_te1_, lora_te2_) through Kuafu's merge sample (Euler, 4 steps at 16 x 24 px, guidance 3) as
// Kuafu's adapted pipeline; each encoder's adapters move the latents by more than 10x the bound.
TEST(DiffusionTrainingTest, SdxlTextEncoderLoraTrainsBothEncodersAndItsExportsSampleAsDiffusers) {
  const fs::path root = test_root();
  prepare(root);
  fs::copy(testing::build_reference("diffusers_sdxl_reference.py", "sdxl_pipeline").dir / "pipe", root / "sdxl_pipe",
           fs::copy_options::recursive);
  const std::string pipe = (root / "sdxl_pipe").string();
  const config::Config config = tiny_config(root, "te_lora", {"model.pipeline=\"" + pipe + "\"", "lora.rank=4", "lora.alpha=8",
                                                              "lora.text_encoder=true", "optim.name=\"adamw\"", "optim.lr=1e-2"});
  train::train_app(*make_sd_app(config), config);
  export_adapter_and_merged(config, root);

  const nn::LoraSpec spec{4, 8, 0, {"to_q", "to_k", "to_v", "to_out.0"}, std::nullopt};
  const auto adapted = [&](bool first_encoder, bool second_encoder) {
    Pipeline p = load_pipeline(pipe);
    nn::apply_lora(*p.unet, spec);
    train::load_checkpoint_weights(config, "", *p.unet, "unet");
    if (first_encoder) {
      nn::apply_lora(*p.text_encoder, text_encoder_lora_spec(spec));
      train::load_checkpoint_weights(config, "", *p.text_encoder, "text_encoder");
    }
    if (second_encoder) {
      nn::apply_lora(*p.text_encoder_2, text_encoder_lora_spec(spec));
      train::load_checkpoint_weights(config, "", *p.text_encoder_2, "text_encoder_2");
    }
    return p;
  };
  SampleOptions options = four_steps_from({2, 4, 8, 12}, 6, root / "lora_latents.safetensors");
  options.height = 16;
  options.width = 24;
  const std::vector<std::string> prompts = {"a red square, number 1", "a blue square"};
  Pipeline mine = adapted(true, true);
  const torch::Tensor ours = sample(mine, prompts, options).latents;
  const double bound = expect_exports_sample_as(ours, "diffusers_sdxl_reference.py", pipe, root, "SDXL text-encoder LoRA");
  Pipeline with_kohya = load_pipeline(pipe);
  int64_t adapted_layers = 0;
  for (const auto& item : mine.unet->named_parameters()) adapted_layers += item.key().find(".lora_A.") != std::string::npos;
  for (const auto* encoder : {&mine.text_encoder, &mine.text_encoder_2}) {
    for (const auto& item : (*encoder)->named_parameters()) adapted_layers += item.key().find(".lora_A.") != std::string::npos;
  }
  EXPECT_EQ(merge_kohya_lora(with_kohya, (root / "adapter" / kKohyaLoraFile).string(), 1.0), adapted_layers) << "every adapted layer";
  EXPECT_LT(testing::max_abs_difference(ours, sample(with_kohya, prompts, options).latents), bound);
  for (const auto& [first, second] : {std::pair{false, true}, std::pair{true, false}}) {
    Pipeline partial = adapted(first, second);
    EXPECT_GT(testing::max_abs_difference(ours, sample(partial, prompts, options).latents), 10 * bound)
        << (first ? "the second" : "the first") << " encoder's adapters count";
  }
}

// With lora.text_encoder, activation checkpointing and data parallelism (2 Gloo ranks) take the serial run's 3 SGD
// steps of both models: the UNet's adapters and the text encoder's, whose gradient comes through the text (the
// bounds of the UNet's runs above).
TEST(DiffusionTrainingTest, TextEncoderLoraTakesTheSerialStepsUnderCheckpointingAndDataParallelism) {
  const fs::path root = test_root();
  const std::vector<std::string> lora = {"lora.rank=4", "lora.alpha=8", "lora.text_encoder=true"};
  if (!testing::is_worker()) {
    prepare(root);
    train_serial_and_checkpointed(root, lora);
    testing::run_test_on_ranks(2, 300);
    ASSERT_GT(unet_grad_norms(root / "serial", "text_encoder").at(0), 0.0);
    for (const char* run : {"checkpointed", "data"}) {
      for (const char* part : {"unet", "text_encoder"}) expect_same_steps(root, run, "serial", part);
    }
    return;
  }
  train_on_ranks(tiny_config(root, "data", joined(lora, {"train.micro_batch_size=2"})));
}

// Under bf16 the trainable adapters stay float32 (the optimizer steps float32 masters; the model computes
// with bf16 copies), so AdamW steps of at most 1e-5 move lora_A's values (up to about 0.2, where a bf16
// step is 5e-4 to 1e-3) instead of rounding away: between the checkpoints of steps 1 and 3 every element
// of lora_A moves, by at most 1e-6 to 1e-4, while its bf16 rounding stays the same for most (measured:
// 8.7e-6 at most, 99.2% the same in bf16).
TEST(DiffusionTrainingTest, LoraAdaptersStayFloat32UnderBf16) {
  const fs::path root = test_root();
  prepare(root);
  const config::Config config = tiny_config(root, "lora_bf16", {"lora.rank=4", "lora.alpha=8", "precision.dtype=\"bf16\"",
                                                                "optim.name=\"adamw\"", "optim.lr=1e-5", "optim.min_lr=0", "optim.schedule=\"constant\"", "train.checkpoint_interval=1",
                                                                "train.keep_checkpoints=3"});
  train::train_app(*make_sd_app(config), config);
  const std::string name = "mid_block.attentions.0.transformer_blocks.0.attn1.to_q.lora_A.weight";
  const torch::Tensor first = testing::saved(root, "lora_bf16", "unet.model.safetensors", 1).find(name)->clone();
  const torch::Tensor last = testing::saved(root, "lora_bf16", "unet.model.safetensors", kSteps).find(name)->clone();
  ASSERT_EQ(last.scalar_type(), torch::kFloat32) << "the saved adapter is its float32 master";
  const double moved = testing::max_abs_difference(first, last);
  const double share_moved = first.ne(last).to(torch::kFloat32).mean().item<double>();
  const double same_in_bf16 = first.to(torch::kBFloat16).eq(last.to(torch::kBFloat16)).to(torch::kFloat32).mean().item<double>();
  EXPECT_GT(moved, 1e-6);
  EXPECT_LT(moved, 1e-4);
  EXPECT_GT(share_moved, 0.9);
  EXPECT_GT(same_in_bf16, 0.8) << "steps this small would mostly be lost on bf16 weights";
  std::cout << "moved " << moved << ", share moved " << share_moved << ", same in bf16 " << same_in_bf16 << "\n";
}

// DreamBooth's objective with prior preservation against train_dreambooth.py's (diffusers_training_reference.py): two
// instance rows captioned "a photo of sks cat" and two class rows "a photo of a cat" in one UNet call, the instance
// half's squared error plus 0.7 x the class half's; the loss and six UNet gradients (float32: 1e-5 relative on the
// loss, 1e-5 x the largest gradient entry, as the plain step's).
TEST(DreamBoothTest, APriorPreservationStepIsDiffusersDreamBoothStep) {
  const testing::Reference& ref = training_reference();
  Pipeline p = load_pipeline((ref.dir / "pipe").string());
  const torch::Tensor text = encode_prompts(p, {"a photo of sks cat", "a photo of sks cat", "a photo of a cat", "a photo of a cat"}).text.detach();
  const DiffusionInputs instance{ref["latents"], text.narrow(0, 0, 2), ref["noise"], ref["timesteps"], {}};
  const DiffusionInputs prior{ref["db_class_latents"], text.narrow(0, 2, 2), ref["db_class_noise"], ref["db_class_timesteps"], {}};
  const torch::Tensor loss = prior_preservation_loss(p.unet, NoiseSchedule(p.scheduler.config), instance, prior, 0.7);
  loss.backward();
  const double expected = ref["db_loss"].item<double>();
  EXPECT_NEAR(loss.item<double>(), expected, 1e-5 * expected);
  const auto params = p.unet->named_parameters();
  double worst = 0;
  for (const char* name : {"conv_in.weight", "down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight",
                           "mid_block.resnets.0.conv1.weight", "up_blocks.1.resnets.1.time_emb_proj.weight", "conv_out.bias",
                           "time_embedding.linear_1.weight"}) {
    const torch::Tensor& want = ref[std::string("db.") + name];
    const double difference = testing::max_abs_difference(params[name].grad(), want) / want.abs().max().item<double>();
    EXPECT_LT(difference, 1e-5) << name;
    worst = std::max(worst, difference);
  }
  std::cout << "DreamBooth step: loss " << loss.item<double>() << " vs " << expected << ", gradients within " << worst
            << " of their largest\n";
}

// DreamBooth's class images are the pipeline's own samples of the class prompt (image n from seed train.seed + n,
// as `sample` draws it: the PNG's pixels within 1/255), made once: a second run makes none. Under activation
// checkpointing and data parallelism (2 Gloo ranks) the run with prior preservation takes the serial run's 3 SGD
// steps (each row's class image and draws from the seed, step and row; the bounds of the plain runs above).
TEST(DreamBoothTest, ClassImagesAreThePipelinesOwnAndPriorPreservationTakesTheSerialSteps) {
  const fs::path root = test_root();
  const std::vector<std::string> dreambooth = {
      "dreambooth.instance_prompt=\"a photo of sks square\"", "dreambooth.class_data=\"" + (root / "classes").string() + "\"",
      "dreambooth.class_prompt=\"a photo of a square\"", "dreambooth.class_images=3", "dreambooth.class_sample_steps=3",
      "dreambooth.prior_loss_weight=0.5", "dreambooth.class_guidance=2"};
  if (!testing::is_worker()) {
    prepare(root);
    train_serial_and_checkpointed(root, dreambooth);
    const SdSettings settings = read_sd_settings(tiny_config(root, "serial", dreambooth));
    ASSERT_EQ(count_class_images(settings.dreambooth), 3);
    EXPECT_EQ(make_class_images(settings, torch::kCPU), 0) << "made once";
    Pipeline p = load_pipeline((root / "pipe").string());
    SampleOptions options;
    options.steps = 3;
    options.guidance = 2;
    for (int n = 0; n < 3; ++n) {
      options.seed = settings.train.seed + static_cast<uint64_t>(n);
      const io::RgbImage want = sample_grid(sample(p, {"a photo of a square"}, options).images);
      const cv::Mat made = cv::imread((root / "classes/class" / (std::to_string(n) + ".png")).string(), cv::IMREAD_COLOR);
      ASSERT_EQ(made.rows, want.height);
      cv::Mat rgb;
      cv::cvtColor(made, rgb, cv::COLOR_BGR2RGB);
      const torch::Tensor a = torch::from_blob(rgb.data, {rgb.rows, rgb.cols, 3}, torch::kUInt8).to(torch::kInt32);
      const torch::Tensor b = torch::tensor(std::vector<int32_t>(want.pixels.begin(), want.pixels.end())).view({want.height, want.width, 3});
      EXPECT_LE((a - b).abs().max().item<int>(), 1) << n;
      std::ifstream caption(root / "classes/class" / (std::to_string(n) + ".txt"));
      EXPECT_EQ(std::string((std::istreambuf_iterator<char>(caption)), std::istreambuf_iterator<char>()), "a photo of a square");
    }
    testing::run_test_on_ranks(2, 300);
    for (const char* run : {"checkpointed", "data"}) expect_same_steps(root, run, "serial");
    return;
  }
  train_on_ranks(tiny_config(root, "data", joined(dreambooth, {"train.micro_batch_size=2"})));
}

// Prior preservation needs its class prompt; the class rows' weight makes the loss move linearly (the instance
// rows' loss at weight 0, the class rows' plain mean added at each weight).
TEST(DreamBoothTest, TheClassPromptIsRequiredAndThePriorWeightAddsTheClassRows) {
  const fs::path root = test_root();
  prepare(root);
  const std::string classes = "dreambooth.class_data=\"" + (root / "classes").string() + "\"";
  const std::string error = testing::expected_error([&] { read_sd_settings(tiny_config(root, "run", {classes})); });
  EXPECT_TRUE(testing::Contains(error, "key 'dreambooth.class_prompt'")) << error;
  std::map<double, double> loss;
  for (const double weight : {0.0, 0.5, 1.0}) {
    std::unique_ptr<train::App> app;
    auto task = serial_task(tiny_config(root, "run", {classes, "dreambooth.class_prompt=\"a square\"", "dreambooth.class_images=2",
                                                      "dreambooth.class_sample_steps=2", "dreambooth.prior_loss_weight=" + std::to_string(weight)}),
                            app);
    torch::NoGradGuard no_grad;
    loss[weight] = task->losses(1, 0, 4).at("unet").item<double>();
  }
  std::unique_ptr<train::App> plain_app;
  auto plain = serial_task(tiny_config(root, "run", {}), plain_app);
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(loss[0.0], plain->losses(1, 0, 4).at("unet").item<double>(), 1e-6 * loss[0.0]) << "weight 0: the instance rows alone";
  EXPECT_GT(loss[0.5] - loss[0.0], 1e-3);
  EXPECT_NEAR(loss[1.0] - loss[0.0], 2 * (loss[0.5] - loss[0.0]), 1e-5 * loss[1.0]);
}

// Textual inversion against diffusers' textual_inversion.py (diffusers_training_reference.py): the concept's two
// tokens take the ids after the vocabulary, a prompt's "<tiny-cat>" reads as both its vectors (as diffusers'
// pipelines expand it) and upper case as lower, as transformers' tokenizer reads the script's captions; each
// vector starts as "cat"'s embedding; the loss and the gradients of the concept's rows are the script's
// (float32: 1e-5 relative on the loss and 1e-5 x the largest gradient entry, as the UNet's step above).
TEST(TextualInversionTest, AStepIsDiffusersTextualInversionStep) {
  const testing::Reference& ref = training_reference();
  Pipeline p = load_pipeline((ref.dir / "pipe").string());
  ASSERT_EQ(p.tokenizer.vocab_size(), ref["ti_vocab"].item<int64_t>());
  const torch::Tensor cat = p.text_encoder->embeddings->token_embedding->parameters().front()[p.tokenizer.bpe().encode("cat").at(0)];
  EXPECT_TRUE(torch::equal(ref["ti_rows"], cat.detach().expand({2, -1})));
  add_concept(p, "<tiny-cat>", ref["ti_rows"]);
  const std::vector<std::string> captions = {"a photo of <tiny-cat>", "A rendering of <Tiny-Cat>_1 by <tiny-cat>s"};
  EXPECT_TRUE(torch::equal(p.tokenizer.encode(captions), ref["ti_ids"])) << p.tokenizer.encode(captions).slice(1, 0, 20);

  const torch::Tensor rows = ref["ti_rows"].clone().requires_grad_(true);  // [2, D], as the task trains them
  p.added_token_rows = rows;
  const NoiseSchedule schedule(p.scheduler.config);
  const torch::Tensor text = encode_prompts(p, captions).text;
  const torch::Tensor loss = diffusion_loss(p.unet, schedule, {ref["latents"], text, ref["noise"], ref["timesteps"], {}}, 0);
  loss.backward();
  const double expected = ref["ti_loss"].item<double>();
  EXPECT_NEAR(loss.item<double>(), expected, 1e-5 * expected);
  const torch::Tensor& want = ref["ti_grad"];
  EXPECT_LT(testing::max_abs_difference(rows.grad(), want), 1e-5 * want.abs().max().item<double>());
  EXPECT_GT(want.abs().min().item<double>(), 0.0) << "every element of both vectors has a gradient to compare";
  std::cout << "textual inversion step: loss " << loss.item<double>() << " vs " << expected << ", gradients within "
            << testing::max_abs_difference(rows.grad(), want) << " of " << want.abs().max().item<double>() << "\n";
}

// A textual-inversion run (kuafu-sd train, model.train = "textual_inversion", AdamW with a moving average) moves
// the concept's rows alone: the UNet and text encoder are frozen and not saved. `export` writes
// learned_embeds.safetensors ({"<tiny-cat>": [2, D]}, the moving average's rows), which diffusers'
// load_textual_inversion reads: its pipeline samples the prompts naming the concept from the same initial latents as
// Kuafu's `sample --embedding` path (DDIM, 4 steps, guidance 3; 1e-4 x the latents' largest value, float32
// through ten UNet calls).
TEST(TextualInversionTest, OnlyTheConceptTrainsAndItsFileSamplesAsDiffusersLoadsIt) {
  const fs::path root = test_root();
  prepare(root);
  const config::Config config =
      tiny_config(root, "concept", {"model.train=\"textual_inversion\"", "textual_inversion.token=\"<tiny-cat>\"",
                                    "textual_inversion.initializer=\"cat\"", "textual_inversion.vectors=2", "optim.name=\"adamw\"",
                                    "optim.lr=0.05", "optim.ema_decay=0.5", "diffusion.caption_dropout=0"});
  train::train_app(*make_sd_app(config), config);
  const io::SafetensorsFile saved = testing::saved(root, "concept", "tokens.model.safetensors", kSteps);
  ASSERT_EQ(saved.tensors.size(), 1u) << "the concept's rows alone are trained and saved";
  const torch::Tensor initial = training_reference()["ti_rows"];  // "cat"'s row, twice
  const torch::Tensor trained = *saved.find("rows");
  ASSERT_EQ(trained.sizes(), initial.sizes());
  EXPECT_GT((trained - initial).abs().amin(1).min().item<double>(), 1e-3) << "both vectors moved";

  config::ParsedCommand command;
  command.options = {{"out", (root / "embedding").string()}, {"checkpoint", ""}};
  train::export_app(*make_sd_app(config), config, command);
  const fs::path file = root / "embedding" / kLearnedEmbedsFile;
  const io::SafetensorsFile exported = io::load_safetensors(file.string());
  ASSERT_NE(exported.find("<tiny-cat>"), nullptr);
  EXPECT_GT(testing::max_abs_difference(*exported.find("<tiny-cat>"), trained), 0.0) << "the moving average's rows, not the last step's";
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { train::export_app(*make_sd_app(config), config, command); }), "exists"))
      << "an existing folder is never overwritten";

  Pipeline p = load_pipeline((root / "pipe").string());
  EXPECT_EQ(load_textual_inversion(p, file.string()), "<tiny-cat>");
  const SampleOptions options = four_steps_from({2, 4, 8, 8}, 5, root / "ti_latents.safetensors");
  const Samples mine = sample(p, {"a photo of <tiny-cat>", "<tiny-cat> on a mat"}, options);
  const torch::Tensor theirs = python_output("embedding_sample " + (root / "pipe").string() + " " + file.string() + " " +
                                                 (root / "ti_latents.safetensors").string(),
                                             root / "ti_out.safetensors", "latents");
  EXPECT_LT(testing::max_abs_difference(mine.latents, theirs), 1e-4 * theirs.abs().max().item<double>());
  std::cout << "concept: latents within " << testing::max_abs_difference(mine.latents, theirs) << " of diffusers'\n";
  Pipeline plain = load_pipeline((root / "pipe").string());
  EXPECT_GT(testing::max_abs_difference(sample(plain, {"a photo of <tiny-cat>", "<tiny-cat> on a mat"}, options).latents, theirs), 1e-3)
      << "the concept changes the samples";
}

// SDXL: the concept's rows in both text encoders train (their widths 16 and 24), the pooled text and the hidden states
// both carrying them; the export is SDXL's {"clip_l", "clip_g"} file, which diffusers loads into each encoder
// (load_textual_inversion with the token) and Kuafu's `sample --embedding` reads, both sampling the same latents
// (the folder's Euler, 4 steps; 1e-4 x their largest value, as SD 1.x's above).
TEST(TextualInversionTest, AnSdxlConceptTrainsInBothEncodersAndSamplesAsDiffusersLoadsIt) {
  const fs::path root = test_root();
  prepare(root);
  fs::copy(testing::build_reference("diffusers_sdxl_reference.py", "sdxl_pipeline").dir / "pipe", root / "sdxl_pipe",
           fs::copy_options::recursive);
  const config::Config config =
      tiny_config(root, "concept", {"model.pipeline=\"" + (root / "sdxl_pipe").string() + "\"", "model.train=\"textual_inversion\"",
                                    "textual_inversion.token=\"<tiny-cat>\"", "textual_inversion.initializer=\"cat\"",
                                    "textual_inversion.vectors=2", "optim.name=\"adamw\"", "optim.lr=0.05"});
  train::train_app(*make_sd_app(config), config);
  const io::SafetensorsFile saved = testing::saved(root, "concept", "tokens.model.safetensors", kSteps);
  ASSERT_EQ(saved.tensors.size(), 2u);
  Pipeline p = load_pipeline((root / "sdxl_pipe").string());
  const std::vector<std::pair<std::string, ClipTextModel*>> encoders = {{"rows", &p.text_encoder}, {"rows_2", &p.text_encoder_2}};
  for (const auto& [name, encoder] : encoders) {
    const torch::Tensor table = (*encoder)->embeddings->token_embedding->parameters().front();
    const torch::Tensor cat = table[p.tokenizer.bpe().encode("cat").at(0)].expand({2, -1});
    EXPECT_GT((*saved.find(name) - cat).abs().amin(1).min().item<double>(), 1e-3) << name << ": both vectors moved";
  }

  config::ParsedCommand command;
  command.options = {{"out", (root / "embedding").string()}, {"checkpoint", ""}};
  train::export_app(*make_sd_app(config), config, command);
  const fs::path file = root / "embedding" / kLearnedEmbedsFile;
  const io::SafetensorsFile exported = io::load_safetensors(file.string());
  EXPECT_TRUE(torch::equal(*exported.find("clip_l"), *saved.find("rows")) && torch::equal(*exported.find("clip_g"), *saved.find("rows_2")));
  EXPECT_EQ(load_textual_inversion(p, file.string(), "<tiny-cat>"), "<tiny-cat>");
  SampleOptions options = four_steps_from({2, 4, 8, 12}, 5, root / "ti_latents.safetensors");
  options.height = 16;
  options.width = 24;
  const Samples mine = sample(p, {"a photo of <tiny-cat>", "<tiny-cat> on a mat"}, options);
  const fs::path out = root / "ti_out.safetensors";
  const testing::PythonRun run = testing::run_python_reference(
      "diffusers_sdxl_reference.py", "embedding_sample " + (root / "sdxl_pipe").string() + " " + file.string() + " '<tiny-cat>' " +
                                         (root / "ti_latents.safetensors").string() + " " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const torch::Tensor theirs = *io::load_safetensors(out.string()).find("latents");
  EXPECT_LT(testing::max_abs_difference(mine.latents, theirs), 1e-4 * theirs.abs().max().item<double>());
  std::cout << "SDXL concept: latents within " << testing::max_abs_difference(mine.latents, theirs) << " of diffusers'\n";
}

// Textual inversion under activation checkpointing of the frozen UNet (the gradient reaches the text through
// recomputed blocks) and data parallelism on 2 Gloo ranks takes the serial run's 3 SGD steps of the concept's rows
// (caption drop-out, Min-SNR and noise offset on; the bounds of the UNet's runs above).
TEST(TextualInversionTest, CheckpointingAndDataParallelismTakeTheSerialSteps) {
  const fs::path root = test_root();
  const std::vector<std::string> concept = {"model.train=\"textual_inversion\"", "textual_inversion.token=\"<tiny-cat>\"",
                                            "textual_inversion.initializer=\"cat\"", "textual_inversion.vectors=2"};
  if (!testing::is_worker()) {
    prepare(root);
    train_serial_and_checkpointed(root, concept);
    testing::run_test_on_ranks(2, 300);
    ASSERT_GT(unet_grad_norms(root / "serial", "tokens").at(0), 0.0);
    for (const char* run : {"checkpointed", "data"}) expect_same_steps(root, run, "serial", "tokens");
    return;
  }
  train_on_ranks(tiny_config(root, "data", joined(concept, {"train.micro_batch_size=2"})));
}

// With textual_inversion.captions = "images" each row is captioned by its image's own caption, "{}" read as the
// concept's token (both vectors); the encoding cache gives the same loss.
TEST(TextualInversionTest, ImageCaptionsReadTheirBracesAsTheToken) {
  const fs::path root = test_root();
  prepare(root);
  for (const auto& entry : fs::recursive_directory_iterator(root / "images/train")) {
    if (entry.path().extension() != ".txt") continue;
    std::ifstream in(entry.path());
    std::string caption((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    caption.replace(caption.find("square"), 6, "{} square");
    std::ofstream(entry.path()) << caption;
  }
  const std::vector<std::string> concept = {"model.train=\"textual_inversion\"", "textual_inversion.token=\"<tiny-cat>\"",
                                            "textual_inversion.initializer=\"cat\"", "textual_inversion.vectors=2",
                                            "textual_inversion.captions=\"images\"", "diffusion.caption_dropout=0"};
  std::unique_ptr<train::App> app;
  auto task = serial_task(tiny_config(root, "run", concept), app);
  torch::NoGradGuard no_grad;
  std::vector<RowDraws> draws;
  for (int64_t r = 0; r < 2; ++r) draws.push_back(draw_row(1, 0, r, {4, 8, 8}, 1000, DiffusionSettings{}));
  const DiffusionInputs in = task->inputs({0, 1}, draws, true, 0);
  Pipeline& p = task->pipeline();
  const torch::Tensor ids = p.tokenizer.encode(std::vector<std::string>{"a blue <tiny-cat> square, number 1"});
  EXPECT_EQ(ids.eq(p.tokenizer.vocab_size() - 2).sum().item<int64_t>(), 1);
  EXPECT_EQ(ids.eq(p.tokenizer.vocab_size() - 1).sum().item<int64_t>(), 1);
  const torch::Tensor expected =
      encode_prompts(p, {"a blue <tiny-cat> square, number 1", "a blue <tiny-cat> square, number 3"}).text;
  EXPECT_EQ(testing::max_abs_difference(in.text, expected), 0.0);

  std::vector<std::string> cached = concept;
  cached.push_back("diffusion.cache=true");
  std::unique_ptr<train::App> cached_app;
  auto cached_task = serial_task(tiny_config(root, "run", cached), cached_app);
  const double a = cached_task->losses(0, 0, 4).at("tokens").item<double>(), b = task->losses(0, 0, 4).at("tokens").item<double>();
  EXPECT_NEAR(a, b, 1e-6 * b);
}

// Bad concepts are refused by name: an initializer of two tokens, a token the vocabulary has, no token; an embedding
// file whose width is not the text encoder's, or that is no embedding at all.
TEST(TextualInversionTest, BadConceptsAndFilesAreRefusedByName) {
  const fs::path root = test_root();
  prepare(root);
  const std::vector<std::string> concept = {"model.train=\"textual_inversion\"", "textual_inversion.token=\"<tiny-cat>\"",
                                            "textual_inversion.initializer=\"cat\""};
  const auto error_with = [&](const std::string& change) {
    std::vector<std::string> overrides = concept;
    overrides.push_back(change);
    std::unique_ptr<train::App> app;
    return testing::expected_error([&] { serial_task(tiny_config(root, "run", overrides), app); });
  };
  const std::string two_words = error_with("textual_inversion.initializer=\"black cat\"");
  EXPECT_TRUE(testing::Contains(two_words, "key 'textual_inversion.initializer'")) << two_words;
  const std::string known = error_with("textual_inversion.token=\"<|endoftext|>\"");
  EXPECT_TRUE(testing::Contains(known, "already in the tokenizer's vocabulary")) << known;
  const std::string none = error_with("textual_inversion.token=\"\"");
  EXPECT_TRUE(testing::Contains(none, "key 'textual_inversion.token'")) << none;

  Pipeline p = load_pipeline((root / "pipe").string());
  const std::string narrow = (root / "narrow.safetensors").string();
  io::save_safetensors(narrow, {{"<x>", torch::zeros({1, 7})}});
  const std::string width = testing::expected_error([&] { load_textual_inversion(p, narrow); });
  EXPECT_TRUE(testing::Contains(width, narrow) && testing::Contains(width, "width 12")) << width;
  const std::string other = (root / "other.safetensors").string();
  io::save_safetensors(other, {{"a", torch::zeros({1, 12})}, {"b", torch::zeros({1, 12})}});
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { load_textual_inversion(p, other); }), "not a textual-inversion embedding"));
}

// From scratch: `init` writes a pipeline folder diffusers loads (its character-level tokenizer giving
// transformers' ids, each model the size Kuafu built); the VAE trained on the images 40 AdamW steps
// raises the evaluation images' PSNR by more than 3 dB; its export sets scaling_factor so the training
// images' latents have unit spread; the UNet then trains on that folder.
TEST(FromScratchTest, InitThenTheVaeThenTheUNet) {
  const fs::path root = test_root();
  prepare(root);
  const std::vector<std::string> shape = {"init.text_hidden_size=16", "init.text_layers=1", "init.vae_block_out_channels=[8, 16]",
                                          "init.unet_block_out_channels=[16, 32]", "init.sample_size=8", "init.norm_num_groups=4"};
  const config::Config init = config::Config::from_string("", (root / "init.toml").string(), sd_schema(), shape);
  const NewPipelineShape s = new_pipeline_shape(init);
  write_new_pipeline(s, (root / "p0").string(), 5);
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { write_new_pipeline(s, (root / "p0").string(), 5); }), "already exists"));
  const testing::PythonRun check =
      testing::run_python_reference("diffusers_training_reference.py", "check_new_pipeline " + (root / "p0").string() + " 'A red square: No. 7!'");
  ASSERT_EQ(check.exit_code, 0) << check.output;
  const nlohmann::json loaded = testing::last_json_line(check.output);
  Pipeline p0 = load_pipeline((root / "p0").string());
  EXPECT_EQ(loaded["ids"].get<std::vector<int64_t>>(), p0.tokenizer.encode(std::string("A red square: No. 7!")));
  EXPECT_EQ(loaded["unet"].get<int64_t>(), s.unet.parameter_count());
  EXPECT_EQ(p0.unet->config.cross_attention_dim, 16);

  auto vae_config = [&](const std::string& run, std::vector<std::string> extra) {
    std::vector<std::string> overrides = {"model.train=\"vae\"", "model.pipeline=\"" + (root / "p0").string() + "\"",
                                          "optim.name=\"adamw\"", "optim.lr=3e-3", "train.steps=40", "vae.kl_weight=1e-4"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return tiny_config(root, run, overrides);
  };
  const config::Config vae = vae_config("vae", {});
  auto psnr = [&](const std::string& checkpoint) {
    ::testing::internal::CaptureStdout();
    train::eval_app(*make_sd_app(vae), vae, checkpoint);
    return testing::last_json_line(::testing::internal::GetCapturedStdout())["val_psnr"].get<double>();
  };
  const double before = psnr("init");
  train::train_app(*make_sd_app(vae), vae);
  const double after = psnr("");
  EXPECT_GT(after, before + 3.0) << before << " dB -> " << after << " dB";

  // Under ZeRO-2 the VAE is left described (lazy construction) and its strategy reads the folder into
  // its chunks: each of the first two steps has the plain run's loss and gradient norm (float32, the
  // same sums in chunk order: 1e-5 relative). Evaluating that run makes the VAE whole.
  std::vector<std::vector<nlohmann::json>> short_runs;
  for (const std::string strategy : {"none", "zero2"}) {
    const config::Config c = vae_config("vae_" + strategy, {"train.steps=2", "memory.strategy=\"" + strategy + "\""});
    EXPECT_EQ(train::train_app(*make_sd_app(c), c).steps_done, 2) << strategy;
    short_runs.push_back(testing::metric_lines(root / ("vae_" + strategy) / "metrics.jsonl"));
    ::testing::internal::CaptureStdout();
    train::eval_app(*make_sd_app(c), c, "");
    EXPECT_GT(testing::last_json_line(::testing::internal::GetCapturedStdout())["val_psnr"].get<double>(), 0.0) << strategy;
  }
  for (size_t step = 0; step < 2; ++step) {
    for (const char* key : {"loss", "vae.grad_norm"}) {
      const double want = short_runs[0].at(step).at(key).get<double>();
      EXPECT_GT(want, 0.0) << key;
      EXPECT_NEAR(short_runs[1].at(step).at(key).get<double>(), want, 1e-5 * want) << key << " step " << step + 1;
    }
  }

  config::ParsedCommand command;
  command.options = {{"out", (root / "p1").string()}, {"checkpoint", ""}};
  train::export_app(*make_sd_app(vae), vae, command);
  AutoencoderKL trained = load_vae((root / "p1/vae").string());
  EXPECT_NE(trained->config.scaling_factor, 1.0);
  std::unique_ptr<io::ImageDataset> images = open_captioned_images(vae, true, 3, 16);
  const double spread = trained->config.scaling_factor / latent_scaling_factor(trained, *images, 256, 4, 99);
  EXPECT_NEAR(spread, 1.0, 0.1) << "latents x scaling_factor have unit spread (another draw of the posterior)";

  const config::Config unet = tiny_config(root, "unet", {"model.pipeline=\"" + (root / "p1").string() + "\"", "train.steps=2"});
  EXPECT_EQ(train::train_app(*make_sd_app(unet), unet).steps_done, 2);
}

// The emoji recipe on a package of the same layout: two bases in all five tones hold out tone 0 and tone 1
// (the Latin square), every other image trains (the tone swatches, a modifier alone, are their own
// bases); captions are the index's names; an image the index does
// not name, and the flags by region code, are skipped; a half-transparent pixel is composited onto white.
TEST(EmojiRecipeTest, HoldsOutOneToneOfEachBaseAndCaptionsByName) {
  const fs::path root = testing::temp_dir("sd_emoji");
  const fs::path images = root / "gem/app/assets/images/tanuki_emoji";
  fs::create_directories(images);
  fs::create_directories(root / "gem/vendor/emojione-alpha-codes");
  nlohmann::json index;
  const std::vector<std::string> tones = {"light", "medium-light", "medium", "medium-dark", "dark"};
  auto add = [&](const std::string& codes, const std::string& name) {
    index[codes] = {{"output", codes}, {"name", name}};
    std::string file = "emoji_u" + codes + ".png";
    for (char& c : file) c = c == '-' ? '_' : c;
    cv::Mat rgba(4, 4, CV_8UC4, cv::Scalar(0, 0, 200, 255));  // opaque red (BGRA)
    rgba.at<cv::Vec4b>(0, 0) = cv::Vec4b(0, 0, 0, 128);        // half-transparent black
    cv::imwrite((images / file).string(), rgba);
  };
  for (const auto& [base, name] : {std::pair{std::string("1f44b"), std::string("waving hand")}, std::pair{std::string("1f44d"), std::string("thumbs up")}}) {
    add(base, name);
    for (int t = 0; t < 5; ++t) add(base + "-1f3f" + std::string(1, "bcdef"[t]), name + ": " + tones[static_cast<size_t>(t)] + " skin tone");
  }
  add("1f600", "grinning face");
  for (int t = 0; t < 5; ++t) add("1f3f" + std::string(1, "bcdef"[t]), tones[static_cast<size_t>(t)] + " skin tone");  // the swatches
  cv::imwrite((images / "emoji_u1f9ff.png").string(), cv::Mat(4, 4, CV_8UC3, cv::Scalar(1, 2, 3)));  // not in the index
  cv::imwrite((images / "AC.png").string(), cv::Mat(4, 4, CV_8UC3, cv::Scalar(1, 2, 3)));            // a flag
  std::ofstream(root / "gem/vendor/emojione-alpha-codes/eac.json") << index.dump();

  const EmojiSplit split = write_emoji_folders((root / "gem").string(), (root / "train").string(), (root / "held").string());
  EXPECT_EQ(split.toned_bases, 2);
  EXPECT_EQ(split.held_out, 2);
  EXPECT_EQ(split.train, 16) << "11 emoji and the 5 swatches, each its own base";
  EXPECT_TRUE(fs::exists(root / "train/1f3fb/emoji_u1f3fb.png"));
  EXPECT_EQ(split.unnamed, 1);
  EXPECT_TRUE(fs::exists(root / "held/1f44b/emoji_u1f44b_1f3fb.png"));
  EXPECT_TRUE(fs::exists(root / "held/1f44d/emoji_u1f44d_1f3fc.png"));
  EXPECT_TRUE(fs::exists(root / "train/1f44b/emoji_u1f44b_1f3fc.png"));
  EXPECT_EQ(read_file((root / "held/1f44d/emoji_u1f44d_1f3fc.txt").string()), "thumbs up: medium-light skin tone");
  const cv::Mat written = cv::imread((root / "train/1f600/emoji_u1f600.png").string(), cv::IMREAD_COLOR);
  EXPECT_EQ(written.at<cv::Vec3b>(1, 1), cv::Vec3b(0, 0, 200));
  EXPECT_EQ(written.at<cv::Vec3b>(0, 0), cv::Vec3b(127, 127, 127)) << "half-transparent black on white";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] {
    write_emoji_folders((root / "gem").string(), (root / "train").string(), (root / "held2").string());
  }), "already exists"));
  EXPECT_EQ(skin_tone_of("1f44b-1f3fe"), 3);
  EXPECT_EQ(skin_tone_of("1f44b"), -1);
}

}  // namespace
}  // namespace kuafu::sd

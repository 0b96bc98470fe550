// The UNet against diffusers (tests/python/diffusers_unet_reference.py) in SD 1.x's shape (convolution
// projections, a DownBlock2D / UpBlock2D pair), SD 2.x's (linear projections, per-block heads, upcast
// attention, two layers per block) and SDXL's (the pooled text and time ids added to the time embedding, a
// first block without attention, 1, 2 and 3 transformer blocks per block, non-square latents): a unet/
// folder diffusers saved gives its prediction, an odd latent size (9 halved to 5 and back) included, and
// what Kuafu writes loads back in diffusers with Kuafu's.
// Float32, 1e-4 absolute on outputs of order 1 (five blocks of convolutions, norms and attention summed
// in other orders). A config with a feature Kuafu's UNet does not compute is refused naming the key.
#include <gtest/gtest.h>

#include "apps/stable_diffusion/unet_folder.h"
#include "core/train/lazy_model.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/same_parameters.h"

namespace kuafu::sd {
namespace {

const testing::Reference& unet_reference() {
  static const testing::Reference r = testing::build_reference("diffusers_unet_reference.py", "sd_unet");
  return r;
}


class UNetFolderTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UNetFolderTest, GivesDiffusersPredictionAndKuafusLoadsBack) {
  const testing::Reference& ref = unet_reference();
  UNet2DCondition unet = load_unet((ref.dir / GetParam()).string());
  unet->eval();
  torch::NoGradGuard no_grad;
  const bool sdxl = GetParam() == "sdxl";
  const torch::Tensor latents = sdxl ? ref["sdxl_latents"] : ref["latents"];
  const AddedConditions added = sdxl ? AddedConditions{ref["text_embeds"], ref["time_ids"]} : AddedConditions{};
  EXPECT_EQ(unet->config.text_time(), sdxl);
  int64_t parameters = 0;
  for (const auto& p : unet->parameters()) parameters += p.numel();
  EXPECT_EQ(unet->config.parameter_count(), parameters);
  EXPECT_LT(testing::max_abs_difference(unet->forward(latents, ref["timesteps"], ref["text"], added), ref[GetParam() + "_out"]), 1e-4);
  if (GetParam() == "sd1") {
    const torch::Tensor odd = unet->forward(ref["latents_odd"], ref["timesteps"].narrow(0, 0, 1), ref["text"].narrow(0, 0, 1));
    EXPECT_EQ(odd.sizes(), (std::vector<int64_t>{1, 4, 9, 9}));
    EXPECT_LT(testing::max_abs_difference(odd, ref["sd1_out_odd"]), 1e-4);
  }
  for (auto& p : unet->parameters()) p.mul_(0.9);  // Kuafu's own weights, not the folder's
  const auto dir = testing::temp_dir("unet_export_" + GetParam());
  std::filesystem::remove_all(dir);
  save_unet(unet, dir.string());
  const std::string expected = dir.string() + "_expected.safetensors";
  io::NamedTensors inputs = {{"latents", latents},
                             {"timesteps", ref["timesteps"]},
                             {"text", ref["text"]},
                             {"out", unet->forward(latents, ref["timesteps"], ref["text"], added)}};
  if (sdxl) {
    inputs.emplace_back("text_embeds", added.text_embeds);
    inputs.emplace_back("time_ids", added.time_ids);
  }
  io::save_safetensors(expected, inputs);
  const testing::PythonRun run = testing::run_python_reference("diffusers_unet_reference.py", "check " + dir.string() + " " + expected);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_LT(testing::last_json_line(run.output)["max_difference"].get<double>(), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Shapes, UNetFolderTest, ::testing::Values("sd1", "sd2", "sdxl"));

// An SDXL UNet run without its added conditions, or with a pooled text of the wrong width, is refused naming them.
TEST(UNetTest, AnSdxlUNetNamesTheConditionsItLacks) {
  const testing::Reference& ref = unet_reference();
  UNet2DCondition unet = load_unet((ref.dir / "sdxl").string());
  torch::NoGradGuard no_grad;
  const torch::Tensor latents = ref["sdxl_latents"];
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { unet->forward(latents, ref["timesteps"], ref["text"]); }), "time ids"));
  const AddedConditions narrow{ref["text_embeds"].narrow(1, 0, 8), ref["time_ids"]};
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { unet->forward(latents, ref["timesteps"], ref["text"], narrow); }),
                                "projection_class_embeddings_input_dim"));
}

// Lazy construction (core/train/lazy_model.h): a UNet described on the meta device holds no storage;
// given storage and initialised from a seed it is the UNet made on the CPU from that seed, bit for bit
// (the same draws in the same order); read from a folder straight into bf16 it is the float32 load cast.
TEST(UNetTest, ADescribedUNetDrawsAndLoadsAsAnEagerOne) {
  const std::string dir = (unet_reference().dir / "sd1").string();
  const UNetConfig config = read_unet_config(io::read_hf_config(dir), dir + "/config.json");
  torch::manual_seed(7);
  UNet2DCondition eager(config, torch::kCPU);
  UNet2DCondition lazy(config, torch::kMeta);
  for (const auto& p : lazy->parameters()) ASSERT_TRUE(p.is_meta());
  train::materialize(*lazy, train::Materialization::all_in(torch::kCPU, torch::kFloat32));
  torch::manual_seed(7);
  lazy->initialize();
  testing::expect_same_parameters(*lazy, *eager);
  EXPECT_GT(eager->conv_in->weight.abs().max().item<double>(), 0.0) << "drawn, not left at zero";

  UNet2DCondition whole = load_unet(dir);
  UNet2DCondition bf16 = load_unet(dir, torch::kCPU, torch::kBFloat16);
  testing::expect_same_parameters(*bf16, *whole, torch::kBFloat16);
}

TEST(UNetTest, FeaturesItDoesNotComputeAreNamed) {
  const nlohmann::json base = write_unet_config(UNetConfig{});
  EXPECT_EQ(read_unet_config(base, "unet/config.json").heads, (std::vector<int64_t>{8, 8, 8, 8}));
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"addition_embed_type", "text_image"}, {"class_embed_type", "timestep"}, {"transformer_layers_per_block", {{1, 2}, {1, 2}, {1, 2}, {1, 2}}},
           {"reverse_transformer_layers_per_block", {{1, 2}}},
           {"mid_block_type", "UNetMidBlock2DSimpleCrossAttn"}, {"_class_name", "UNet2DModel"}}) {
    nlohmann::json config = base;
    config[key] = value;
    EXPECT_TRUE(testing::Contains(testing::error_message([&] { read_unet_config(config, "unet/config.json"); }), key)) << key;
  }
  nlohmann::json config = base;
  config["down_block_types"][0] = "SimpleCrossAttnDownBlock2D";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { read_unet_config(config, "unet/config.json"); }), "SimpleCrossAttnDownBlock2D"));
}

}  // namespace
}  // namespace kuafu::sd

// The VAE against diffusers (tests/python/diffusers_vae_reference.py): a vae/ folder diffusers saved, under
// the current and the older attention names, gives diffusers' posterior mean and log-variance and
// decoding; what Kuafu writes loads back in diffusers with Kuafu's outputs. Float32, 1e-4 absolute on
// outputs of order 1 (two blocks of 3x3 convolutions and GroupNorms summed in other orders). And a
// folder that is no AutoencoderKL, or holds another block type, is refused naming the key.
#include <gtest/gtest.h>

#include <fstream>

#include "apps/stable_diffusion/vae_folder.h"
#include "core/train/lazy_model.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/same_parameters.h"

namespace kuafu::sd {
namespace {

const testing::Reference& vae_reference() {
  static const testing::Reference r = testing::build_reference("diffusers_vae_reference.py", "sd_vae");
  return r;
}


class VaeFolderTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VaeFolderTest, GivesDiffusersPosteriorAndDecoding) {
  const testing::Reference& ref = vae_reference();
  AutoencoderKL vae = load_vae((ref.dir / GetParam()).string());
  vae->eval();
  torch::NoGradGuard no_grad;
  const AutoencoderKLImpl::Posterior posterior = vae->encode(ref["images"]);
  EXPECT_LT(testing::max_abs_difference(posterior.mean, ref["mean"]), 1e-4);
  EXPECT_LT(testing::max_abs_difference(posterior.logvar, ref["logvar"]), 1e-4);
  EXPECT_LT(testing::max_abs_difference(vae->decode(ref["mean"]), ref["decoded"]), 1e-4);
  EXPECT_EQ(posterior.mean.sizes(), (std::vector<int64_t>{2, 4, 8, 8}));
}

INSTANTIATE_TEST_SUITE_P(Namings, VaeFolderTest, ::testing::Values("vae", "vae_old_names"));

// Tiles of the config's sample_size (16 px, 8 latents, a quarter overlap) over latents of 21 x 14, whose
// last tile row and column are short: diffusers' tiled decoding, 1e-4 as the whole decoding. Latents
// within one tile decode whole.
TEST(VaeTest, TiledDecodingIsDiffusers) {
  const testing::Reference& ref = vae_reference();
  AutoencoderKL vae = load_vae((ref.dir / "vae").string());
  vae->eval();
  torch::NoGradGuard no_grad;
  ASSERT_EQ(vae->config.sample_size, 16);
  const torch::Tensor tiled = vae->tiled_decode(ref["tiled_latents"], vae->config.sample_size);
  EXPECT_EQ(tiled.sizes(), (std::vector<int64_t>{1, 3, 42, 28}));
  EXPECT_LT(testing::max_abs_difference(tiled, ref["tiled_decoded"]), 1e-4);
  EXPECT_GT(testing::max_abs_difference(tiled, vae->decode(ref["tiled_latents"])), 1e-3) << "the tiles were decoded apart";
  EXPECT_TRUE(torch::equal(vae->tiled_decode(ref["mean"], 16), vae->decode(ref["mean"])));
}

TEST(VaeTest, WhatKuafuWritesLoadsInDiffusersWithKuafusOutputs) {
  const testing::Reference& ref = vae_reference();
  AutoencoderKL vae = load_vae((ref.dir / "vae").string());
  vae->eval();
  torch::NoGradGuard no_grad;
  for (auto& p : vae->parameters()) p.mul_(0.9);  // Kuafu's own weights, not the folder's
  const auto dir = testing::temp_dir("vae_export");
  std::filesystem::remove_all(dir);
  save_vae(vae, dir.string());
  const AutoencoderKLImpl::Posterior posterior = vae->encode(ref["images"]);
  const std::string expected = dir.string() + "_expected.safetensors";
  io::save_safetensors(expected, {{"images", ref["images"]},
                                  {"mean", posterior.mean},
                                  {"logvar", posterior.logvar},
                                  {"decoded", vae->decode(posterior.mean)}});
  const testing::PythonRun run = testing::run_python_reference("diffusers_vae_reference.py", "check " + dir.string() + " " + expected);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_LT(testing::last_json_line(run.output)["max_difference"].get<double>(), 1e-4);
}

// As the UNet's: a described VAE, materialised and initialised, is the eager one from the same seed;
// read into bf16 it is the float32 load cast (sampling and training hold the frozen VAE so).
TEST(VaeTest, ADescribedVaeDrawsAndLoadsAsAnEagerOne) {
  const std::string dir = (vae_reference().dir / "vae").string();
  const VaeConfig config = read_vae_config(io::read_hf_config(dir), dir + "/config.json");
  torch::manual_seed(5);
  AutoencoderKL eager(config, torch::kCPU);
  AutoencoderKL lazy(config, torch::kMeta);
  train::materialize(*lazy, train::Materialization::all_in(torch::kCPU, torch::kFloat32));
  torch::manual_seed(5);
  lazy->initialize();
  testing::expect_same_parameters(*lazy, *eager);
  AutoencoderKL whole = load_vae(dir);
  AutoencoderKL bf16 = load_vae(dir, torch::kCPU, torch::kBFloat16);
  testing::expect_same_parameters(*bf16, *whole, torch::kBFloat16);
}

TEST(VaeTest, AnotherClassOrBlockTypeIsNamed) {
  nlohmann::json config = write_vae_config(VaeConfig{});
  config["_class_name"] = "AutoencoderTiny";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { read_vae_config(config, "vae/config.json"); }),
                                "vae/config.json: _class_name \"AutoencoderTiny\" is not AutoencoderKL"));
  config = write_vae_config(VaeConfig{});
  config["down_block_types"][1] = "AttnDownEncoderBlock2D";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { read_vae_config(config, "vae/config.json"); }), "down_block_types"));
  config = write_vae_config(VaeConfig{});
  config["shift_factor"] = 0.1159;
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { read_vae_config(config, "vae/config.json"); }), "shift_factor"));
}

}  // namespace
}  // namespace kuafu::sd

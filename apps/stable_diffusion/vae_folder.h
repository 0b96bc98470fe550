// The VAE as diffusers' vae/ folders hold it: config.json (_class_name AutoencoderKL; DownEncoderBlock2D /
// UpDecoderBlock2D blocks and SiLU, anything else refused naming the key) and
// diffusion_pytorch_model.safetensors under diffusers' names, the mid block's attention under either
// naming diffusers checkpoints use (to_q / to_k / to_v / to_out.0, or the older query / key / value /
// proj_attn).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "apps/stable_diffusion/vae.h"
#include "core/io/hf_folder.h"
#include "core/train/model_recipe.h"

namespace kuafu::sd {

VaeConfig read_vae_config(const nlohmann::json& config, const std::string& where);
nlohmann::json write_vae_config(const VaeConfig& config);

// The VAE `dir` holds, every weight read from it (nothing drawn): `name` its section models.<name>,
// `trained` whether the run trains it.
train::ModelRecipe<AutoencoderKL> vae_folder_recipe(const std::string& dir, const std::string& name = "", bool trained = false);
// That VAE on `device` in `dtype`, read straight into it.
AutoencoderKL load_vae(const std::string& dir, const torch::Device& device = torch::kCPU, torch::Dtype dtype = torch::kFloat32);
// Reads the weights of VAE folder `dir` into `vae`, whose parameters have storage or (lazy construction)
// go to the WeightSink in scope.
void load_vae_weights(AutoencoderKL& vae, const std::string& dir);
// Writes `vae` as a new folder `dir` that diffusers' AutoencoderKL.from_pretrained loads.
void save_vae(AutoencoderKL& vae, const std::string& dir, const io::HfWriteOptions& options = {});

}  // namespace kuafu::sd

// The UNet as diffusers' unet/ folders hold it: config.json (_class_name UNet2DConditionModel; the SD 1.x
// and 2.x features Kuafu's UNet computes, anything else refused naming the key: class or addition
// embeddings, other block or mid-block types, several transformer layers per block, ...) and
// diffusion_pytorch_model.safetensors under diffusers' names.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "apps/stable_diffusion/unet.h"
#include "core/io/hf_folder.h"
#include "core/nn/lora.h"
#include "core/train/model_recipe.h"

namespace kuafu::sd {

UNetConfig read_unet_config(const nlohmann::json& config, const std::string& where);
nlohmann::json write_unet_config(const UNetConfig& config);

// The UNet `dir` holds, on `device` in `dtype`, read straight into it (described, then filled; no draws).
// The UNet `dir` holds, every weight read from it (nothing drawn).
train::ModelRecipe<UNet2DCondition> unet_folder_recipe(const std::string& dir);
UNet2DCondition load_unet(const std::string& dir, const torch::Device& device = torch::kCPU, torch::Dtype dtype = torch::kFloat32);
// A folder's weights into `unet` (made from its config): materialised tensors are filled, meta ones go
// to the WeightSink in scope (a sharded strategy's chunks).
void load_unet_weights(UNet2DConditionImpl& unet, const io::HfFolder& folder);
// Writes `unet` as a new folder `dir` that diffusers' UNet2DConditionModel.from_pretrained loads.
void save_unet(UNet2DCondition& unet, const std::string& dir, const io::HfWriteOptions& options = {});

// Writes the LoRA adapters of `unet` (applied with `spec`) as a new folder `dir` in both layouts users
// load: PEFT's (adapter_config.json + adapter_model.safetensors, for PeftModel.from_pretrained on the UNet
// of `base_unet_dir`) and diffusers' (pytorch_lora_weights.safetensors, "unet."-prefixed names and the
// adapter's config in its metadata, for StableDiffusionPipeline.load_lora_weights), and kohya's
// (kKohyaLoraFile: ComfyUI, A1111, `kuafu-sd sample --lora`).
// With `text_encoders` (lora.text_encoder), their adapters too: diffusers' file under each component's name
// ("text_encoder.", "text_encoder_2."; transformers 5's paths, without the text_model level) with its config in
// the metadata, kohya's under lora_te_ (SDXL: lora_te1_, lora_te2_).
struct AdaptedTextEncoder {
  std::string component;  // "text_encoder" or "text_encoder_2"
  const torch::nn::Module* model = nullptr;
  nn::LoraSpec spec;
};
void export_unet_adapter(const UNet2DConditionImpl& unet, const nn::LoraSpec& spec, const std::string& dir, const std::string& base_unet_dir,
                         const std::vector<AdaptedTextEncoder>& text_encoders = {});

}  // namespace kuafu::sd

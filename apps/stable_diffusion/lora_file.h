// LoRA files as people share them (kohya-ss sd-scripts' format, which ComfyUI, A1111 and diffusers'
// load_lora_weights read), merged into a pipeline's weights at sample time, and written from training.
#pragma once

#include <string>

#include "apps/stable_diffusion/pipeline.h"
#include "core/io/safetensors.h"
#include "core/nn/lora.h"

namespace kuafu::sd {

// The kohya file `export --adapter` writes into the adapter folder.
inline constexpr const char* kKohyaLoraFile = "kohya_lora.safetensors";

// Merges a kohya LoRA file into `pipeline`'s UNet and text encoders: for each adapted layer
// "lora_unet_<path>", "lora_te_<path>" or "lora_te1_<path>" (SD 1.x/2.x), "lora_te1_"/"lora_te2_<path>" (SDXL's
// two encoders) (the layer's diffusers or transformers path, dots as underscores; a UNet layer also by its path in
// the original model, "lora_unet_input_blocks_4_1_proj_in", as sd-scripts names SDXL's)
// with lora_down [r, in(, kh, kw)], lora_up [out, r(, 1, 1)] and optionally alpha (r when absent),
// W += weight · (alpha / r) · up · down, a convolution's (LoCon) over its kernel. kuafu::Error naming the file
// and the key for a layer the pipeline does not have, a shape that does not fit, or a file with no LoRA key.
// Returns the number of layers merged.
int64_t merge_kohya_lora(Pipeline& pipeline, const std::string& path, double weight);

// `unet`'s LoRA adapters (nn::apply_lora's) in kohya's format, float32: for each adapted layer
// "lora_unet_<path>" (its diffusers path, dots as underscores) with lora_down.weight = lora_A [r, in],
// lora_up.weight = lora_B [out, r] and alpha = spec.alpha (a scalar), so that merge_kohya_lora and
// diffusers' load_lora_weights add (alpha / r) · up · down as training did. kuafu::Error when there is no adapter.
// `prefix`: "lora_unet_", or a text encoder's "lora_te_" (SD 1.x/2.x), "lora_te1_"/"lora_te2_" (SDXL), its layers
// named by their transformers path with the text_model level, as sd-scripts names them.
io::NamedTensors kohya_lora_tensors(const torch::nn::Module& unet, const nn::LoraSpec& spec, const std::string& prefix = "lora_unet_");

}  // namespace kuafu::sd

// LoRA files as people share them for SD 1.x/2.x (kohya-ss sd-scripts' format, which ComfyUI, A1111 and
// diffusers' load_lora_weights read), merged into a pipeline's weights at sample time.
#pragma once

#include <string>

#include "apps/stable_diffusion/pipeline.h"

namespace kuafu::sd {

// Merges a kohya LoRA file into `pipeline`'s UNet and text encoder: for each adapted layer
// "lora_unet_<path>" or "lora_te_<path>" (the layer's diffusers or transformers path, dots as underscores)
// with lora_down [r, in(, kh, kw)], lora_up [out, r(, 1, 1)] and optionally alpha (r when absent),
// W += weight · (alpha / r) · up · down, a convolution's (LoCon) over its kernel. kuafu::Error naming the file
// and the key for a layer the pipeline does not have, a shape that does not fit, or a file with no LoRA key.
// Returns the number of layers merged.
int64_t merge_kohya_lora(Pipeline& pipeline, const std::string& path, double weight);

}  // namespace kuafu::sd

// CLIP's text encoder as diffusers' text_encoder/ folders hold it (transformers' CLIPTextModel):
// config.json <-> ClipTextConfig (hidden_act "quick_gelu" or "gelu"; any other refused by name), the
// stored names ("text_model.*"; old files' position_ids buffer left out), and the export
// CLIPTextModel.from_pretrained loads.
#pragma once

#include "apps/stable_diffusion/clip_text_model.h"
#include "core/train/hf_model_format.h"

namespace kuafu::sd {

using ClipTextFormat = train::HfModelFormat<ClipTextModel, ClipTextConfig>;

const ClipTextFormat& clip_text_format();
// Writes `model` (serial) as a new folder `dir` (config.json with its hidden_act, model.safetensors).
void save_clip_text_model(ClipTextModel& model, const std::string& dir, const io::HfWriteOptions& options = {});

}  // namespace kuafu::sd

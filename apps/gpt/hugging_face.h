// GPT-2 as Hugging Face folders hold it: config.json <-> GPTConfig, the stored tensor names onto the
// model's (GPT2LMHeadModel's "transformer.*", a bare GPT2Model's unprefixed ones; the tied lm_head and
// old attention-mask buffers left out), and the export GPT2LMHeadModel.from_pretrained loads.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "apps/gpt/model.h"
#include "core/io/hf_folder.h"

namespace kuafu::gpt {

// kuafu::Error naming `where` (the config.json) and the key for what Kuafu's GPT-2 does not compute:
// another model_type, an activation other than gelu_new, n_inner other than 4 n_embd, per-layer
// attention scaling, an untied head, or dropout rates that differ between embeddings, attention and
// residual branches.
GPTConfig gpt_config_from_hf(const nlohmann::json& config, const std::string& where);
nlohmann::json hf_config(const GPTConfig& config);

// The model `dir` holds, whole (serial) on `device`, its weights converted to float32 from any floating
// width.
GPT load_hf_gpt(const std::string& dir, torch::Device device = torch::kCPU);
// `folder`'s weights into `model` (built from the folder's config), on any tensor-parallel layout.
void load_hf_weights(GPT& model, const io::HfFolder& folder);

// Writes `model` (serial) as a new Hugging Face folder `dir`, float32, tied head stored once.
void export_hf_gpt(GPT& model, const std::string& dir, const io::HfWriteOptions& options = {});

}  // namespace kuafu::gpt

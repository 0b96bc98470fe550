// OPT as Hugging Face folders hold it (OPTForCausalLM): config.json <-> OPTConfig, the stored names
// ("model.decoder.*", or a bare OPTModel's "decoder.*"; the tied lm_head stored once or as an equal
// copy), and the export OPTForCausalLM.from_pretrained loads.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "apps/opt_finetune/model.h"
#include "core/io/hf_folder.h"

namespace kuafu::opt {

// kuafu::Error naming `where` and the key for what Kuafu's OPT does not compute: another model_type, an
// activation other than ReLU, no biases, LayerNorms without parameters, an untied head.
OPTConfig opt_config_from_hf(const nlohmann::json& config, const std::string& where);
nlohmann::json hf_config(const OPTConfig& config);

// `folder`'s weights into `model` (built from the folder's config), on any tensor-parallel layout.
void load_hf_weights(OPTForCausalLM& model, const io::HfFolder& folder);
OPTForCausalLM load_hf_opt(const std::string& dir, torch::Device device = torch::kCPU);
void export_hf_opt(OPTForCausalLM& model, const std::string& dir, const io::HfWriteOptions& options = {});

}  // namespace kuafu::opt

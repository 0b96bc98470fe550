// The Llama family as Hugging Face folders hold it: config.json <-> LlamaConfig for model_type "llama",
// "qwen2", "qwen3" and "mistral" (rope_parameters as transformers 5 writes them, or an older folder's
// rope_theta and rope_scaling; Qwen's layer_types or use_sliding_window/max_window_layers), the stored
// names ("model.*", a bare base model's "*", an untied "lm_head.weight"), and the export
// AutoModelForCausalLM loads.
#pragma once

#include <string>

#include "apps/opt_finetune/model_llama.h"
#include "core/train/hf_model_format.h"

namespace kuafu::opt {

using LlamaFormat = train::HfModelFormat<LlamaForCausalLM, LlamaConfig>;

// Whether config.json's model_type is one of the family's.
bool is_llama_family(const std::string& model_type);

// The format of `model_type` (kuafu::Error for one outside the family). Reading a config.json refuses,
// naming the file and the key, what Kuafu's decoder does not compute: an activation other than SiLU, a
// rope_type other than default/linear/dynamic/llama3, a partial rotary factor, quantised weights, a layer
// type other than full or sliding attention.
const LlamaFormat& llama_format(const std::string& model_type);

}  // namespace kuafu::opt

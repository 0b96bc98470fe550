// OPT as Hugging Face folders hold it (OPTForCausalLM): config.json <-> OPTConfig, the stored names
// ("model.decoder.*", or a bare OPTModel's "decoder.*"; the tied lm_head stored once or as an equal
// copy), and the export OPTForCausalLM.from_pretrained loads.
#pragma once

#include "apps/opt_finetune/model.h"
#include "core/train/hf_model_format.h"

namespace kuafu::opt {

using OptFormat = train::HfModelFormat<OPTForCausalLM, OPTConfig>;

// Reading a config.json refuses, naming the file and the key, what Kuafu's OPT does not compute:
// another model_type, an activation other than ReLU, no biases, LayerNorms without parameters, an
// untied head.
const OptFormat& opt_format();

}  // namespace kuafu::opt

// GPT-2 as Hugging Face folders hold it (GPT2LMHeadModel): config.json <-> GPTConfig, the stored
// tensor names onto the model's ("transformer.*", or a bare GPT2Model's unprefixed ones; the tied
// lm_head and old attention-mask buffers left out), and the export GPT2LMHeadModel.from_pretrained loads.
#pragma once

#include "apps/gpt/model.h"
#include "core/train/hf_model_format.h"

namespace kuafu::gpt {

using GptFormat = train::HfModelFormat<GPT, GPTConfig>;

// Reading a config.json refuses, naming the file and the key, what Kuafu's GPT-2 does not compute:
// another model_type, an activation other than gelu_new, n_inner other than 4 n_embd, per-layer
// attention scaling, an untied head, or dropout rates that differ between embeddings, attention and
// residual branches.
const GptFormat& gpt_format();

}  // namespace kuafu::gpt

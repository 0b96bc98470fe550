// The kuafu-opt config: its schema (model, data, generate, lora, benchmark keys on top of the
// trainer's) and its sections as typed values, each read in one place with its checks across keys.
#pragma once

#include <string>

#include "apps/opt_finetune/causal_lm_family.h"
#include "core/config/config.h"
#include "core/io/bpe_tokenizer.h"
#include "core/io/instruction_data.h"

namespace kuafu::opt {

config::Schema opt_schema();

// data.*: what the model learns from.
struct OptData {
  bool instructions = true;    // data.kind = "instructions" (JSONL) or "text" (token files)
  std::string tokenizer;       // data.tokenizer, or else model.init_from: a folder with byte-level BPE
  std::string train, val;      // instructions: JSONL files
  std::string text, dir;       // text: what `prepare` tokenizes, and where the token files go
  std::string train_tokens, val_tokens;
  int64_t val_every = 0;
  int64_t context = 0;  // text: tokens per window; instructions: the longest example kept
  bool pack = false;    // instructions: several examples per row of `context` tokens
  bool eos_after_lines = true;  // text: every line is a document, ended by </s>
  bool chat_template = true;    // data.chat_template: conversations framed by the tokenizer folder's template
};
OptData opt_data(const config::Config& config);

// The model's family and shape: model.init_from's config.json (OPT or GPT-2), or model.shape's published
// OPT, or the model.* keys' OPT (model.vocab_size = 0: the tokenizer's vocabulary rounded up to a
// multiple of 8).
LmShape model_config(const config::Config& config, const OptData& data);
LmShape model_config(const config::Config& config);

// The data's tokenizer; kuafu::Error at data.tokenizer when there is none.
io::BpeTokenizer load_tokenizer(const config::Config& config, const OptData& data);
// The model's BOS and EOS in the data's tokenizer (LmShape::special_ids); kuafu::Error at data.tokenizer
// when it lacks them.
LmShape::SpecialIds special_ids(const config::Config& config, const OptData& data, const io::BpeTokenizer& tokenizer,
                                const LmShape& shape);
// How examples are framed: the tokenizer folder's chat template (data.chat_template), or the plain framing
// with the model's BOS beginning every example and its EOS ending every response.
io::InstructionFormat instruction_format(const config::Config& config, const OptData& data,
                                         const io::BpeTokenizer& tokenizer, const LmShape& shape);

}  // namespace kuafu::opt

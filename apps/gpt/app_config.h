// The kuafu-gpt config: its schema (model, data, generate, benchmark keys on top of the trainer's)
// and its sections as typed values, each read in one place with its checks across keys.
#pragma once

#include <string>
#include <vector>

#include "apps/gpt/model.h"
#include "core/config/config.h"

namespace kuafu::gpt {

config::Schema gpt_schema();

// Model shape from the config, or from model.init_from's config.json; model.vocab_size = 0 takes the
// vocabulary of the prepared tokenizer.
GPTConfig model_config(const config::Config& config);
// kuafu::Error at data.context when the windows are longer than the model's positions.
void check_context(const config::Config& config, const GPTConfig& model);

// data.*: the text `prepare` tokenizes and the prepared files under data.dir.
struct TextData {
  std::string text;             // data.text
  std::string dir;              // data.dir
  std::string tokenizer_model;  // <dir>/tokenizer.model
  std::string train_tokens;     // <dir>/train.tok
  std::string val_tokens;       // <dir>/val.tok
  int64_t vocab_size = 0;       // of the tokenizer `prepare` trains
  int64_t val_every = 0;        // every N-th block of 100 lines validates
  int64_t context = 0;          // tokens per training window
};
TextData text_data(const config::Config& config);

}  // namespace kuafu::gpt

// The kuafu-gpt config: its schema (model, data, generate, benchmark keys on top of the trainer's)
// and the conversion of the model section into a GPTConfig.
#pragma once

#include "apps/gpt/model.h"
#include "core/config/config.h"

namespace kuafu::gpt {

config::Schema gpt_schema();

// Model shape from the config; model.vocab_size = 0 takes the vocabulary of the prepared tokenizer.
GPTConfig model_config(const config::Config& config);

// Paths of the prepared data under data.dir.
struct DataPaths {
  std::string tokenizer_model;  // <dir>/tokenizer.model
  std::string train_tokens;     // <dir>/train.tok
  std::string val_tokens;       // <dir>/val.tok
};
DataPaths data_paths(const config::Config& config);

}  // namespace kuafu::gpt

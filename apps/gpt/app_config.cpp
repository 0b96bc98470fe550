#include "apps/gpt/app_config.h"

#include <filesystem>
#include <optional>

#include "apps/gpt/hugging_face.h"
#include "core/io/tokenizer.h"
#include "core/train/benchmark.h"
#include "core/train/generate_settings.h"
#include "core/train/hf_interop.h"
#include "core/train/runtime.h"
#include "core/train/trainer.h"

namespace kuafu::gpt {

config::Schema gpt_schema() {
  config::Schema s;
  train::add_runtime_schema(s);
  train::add_trainer_schema(s);
  // The upper bounds only stop absurd values early; check_model_fits judges what this machine holds.
  s.add_int("model.vocab_size", 0, "vocabulary size; 0 = the prepared tokenizer's").min(0).max(1 << 24);
  s.add_int("model.n_positions", 1024, "longest sequence the position embedding covers").min(1).max(1 << 20);
  s.add_int("model.n_embd", 768, "hidden size C").min(1).max(1 << 18);
  s.add_int("model.n_layer", 12, "transformer blocks").min(1).max(100000);
  s.add_int("model.n_head", 12, "attention heads (must divide model.n_embd)").min(1).max(1 << 12);
  s.add_float("model.dropout", 0.0, "dropout on embeddings, attention and residual branches").min(0).max(0.9);
  s.add_float("model.layer_norm_epsilon", 1e-5, "LayerNorm epsilon").min(0);

  s.add_string("data.text", "data/kjv/out/kjv.txt", "UTF-8 text that `prepare` tokenizes");
  s.add_string("data.dir", "data/kjv/out", "folder for the tokenizer model and the train/val token files");
  s.add_int("data.vocab_size", 4096, "vocabulary of the SentencePiece BPE tokenizer that `prepare` trains")
      .min(300).max(1 << 20);
  s.add_int("data.val_every", 20, "`prepare` puts every N-th block of 100 lines into validation").min(2);
  s.add_int("data.context", 256, "tokens per training window (<= model.n_positions)").min(1);

  train::add_generate_schema(s, "In the beginning", 0.8);

  train::add_benchmark_schema(s);
  train::add_hf_schema(s);
  return s;
}

TextData text_data(const config::Config& config) {
  TextData d;
  d.text = config.get_string("data.text");
  d.dir = config.get_string("data.dir");
  const std::filesystem::path dir = d.dir;
  d.tokenizer_model = (dir / "tokenizer.model").string();
  d.train_tokens = (dir / "train.tok").string();
  d.val_tokens = (dir / "val.tok").string();
  d.vocab_size = config.get_int("data.vocab_size");
  d.val_every = config.get_int("data.val_every");
  d.context = config.get_int("data.context");
  return d;
}

void check_context(const config::Config& config, const GPTConfig& m) {
  if (const int64_t context = config.get_int("data.context"); context > m.n_positions) {
    config.fail_at("data.context", "(" + std::to_string(context) + ") exceeds the model's " +
                                       std::to_string(m.n_positions) + " positions (model.n_positions)");
  }
}

GPTConfig model_config(const config::Config& config) {
  if (std::optional<GPTConfig> folder = gpt_format().init_config(config)) {
    check_context(config, *folder);  // the folder gives the shape; a fine-tune may change the dropout only
    return *folder;
  }
  GPTConfig m;
  gpt_format().numbers.read_config(config, m);
  if (m.vocab_size == 0) {
    const std::string tokenizer = text_data(config).tokenizer_model;
    if (!std::filesystem::exists(tokenizer)) {
      config.fail_at("model.vocab_size", "is 0 (use the tokenizer's) but " + tokenizer +
                                             " does not exist; run `prepare` first or set model.vocab_size");
    }
    m.vocab_size = io::Tokenizer::load(tokenizer).vocab_size();
  }
  if (m.n_embd % m.n_head != 0) {
    config.fail_at("model.n_head", "(" + std::to_string(m.n_head) + ") must divide model.n_embd (" +
                                       std::to_string(m.n_embd) + ")");
  }
  check_context(config, m);
  return m;
}

}  // namespace kuafu::gpt

#include "apps/opt_finetune/app_config.h"

#include <filesystem>
#include <optional>

#include "apps/opt_finetune/hugging_face.h"
#include "apps/opt_finetune/llama_hugging_face.h"
#include "apps/opt_finetune/shapes.h"
#include "core/train/benchmark.h"
#include "core/train/generate_settings.h"
#include "core/train/hf_interop.h"
#include "core/train/peft_adapter.h"
#include "core/train/runtime.h"
#include "core/train/trainer.h"

namespace kuafu::opt {
namespace fs = std::filesystem;

config::Schema opt_schema() {
  config::Schema s;
  train::add_runtime_schema(s);
  train::add_trainer_schema(s);
  std::string shapes;
  for (const std::string& name : opt_shape_names()) shapes += (shapes.empty() ? "" : ", ") + name;
  s.add_string("model.shape", "", "a published OPT shape (" + shapes + "); empty: the model.* keys");
  s.add_int("model.vocab_size", 0, "embedding rows; 0 = the tokenizer's vocabulary rounded up to a multiple of 8")
      .min(0).max(1 << 24);
  s.add_int("model.hidden_size", 768, "hidden size").min(1).max(1 << 18);
  s.add_int("model.num_hidden_layers", 12, "decoder layers").min(1).max(100000);
  s.add_int("model.num_attention_heads", 12, "attention heads (must divide model.hidden_size)").min(1).max(1 << 12);
  s.add_int("model.ffn_dim", 3072, "MLP width").min(1).max(1 << 20);
  s.add_int("model.max_position_embeddings", 2048, "longest sequence").min(1).max(1 << 20);
  s.add_int("model.word_embed_proj_dim", 0, "token embedding width; 0 = model.hidden_size").min(0).max(1 << 18);
  s.add_bool("model.do_layer_norm_before", true, "pre-LN; false: post-LN as opt-350m");
  s.add_float("model.dropout", 0.1, "dropout on embeddings and residual branches").min(0).max(0.9);
  s.add_float("model.attention_dropout", 0.0, "dropout on attention probabilities").min(0).max(0.9);

  s.add_string("data.kind", "instructions", "\"instructions\" (JSONL prompt/response or messages) or \"text\"")
      .choices({"instructions", "text"});
  s.add_string("data.tokenizer", "", "folder with vocab.json + merges.txt or tokenizer.json; empty: model.init_from");
  s.add_string("data.train", "data/instructions/out/train.jsonl", "instructions: training examples (JSONL)");
  s.add_string("data.val", "data/instructions/out/val.jsonl", "instructions: held-out examples (JSONL)");
  s.add_string("data.text", "data/instructions/out/pretrain.txt", "text: UTF-8 text that `prepare` tokenizes");
  s.add_string("data.dir", "data/instructions/out/opt_tokens", "text: folder for the train/val token files");
  s.add_int("data.val_every", 20, "text: `prepare` puts every N-th block of 100 lines into validation").min(2);
  s.add_int("data.context", 256, "text: tokens per window; instructions: longer examples are skipped").min(2);
  s.add_bool("data.eos_after_lines", true,
             "text: each line is a document that `prepare` ends with \"</s>\" (OPT's separator, so the model "
             "learns where a text ends) instead of a newline");
  s.add_bool("data.chat_template", true,
             "instructions: frame conversations with the tokenizer folder's chat template (chat_template.jinja or "
             "tokenizer_config.json's) when it has one, learning each assistant turn and its end-of-turn token; "
             "false, or a folder without one: the plain framing (User: / Assistant:, BOS and EOS)");
  s.add_bool("data.pack", false,
             "instructions: pack several examples into each row of data.context tokens, each attending only to "
             "itself with its own positions (no padding between them)");

  train::add_generate_schema(s, "What does harbinger mean?", 0.0);
  train::add_lora_schema(s);
  train::add_benchmark_schema(s);
  train::add_hf_schema(s);
  return s;
}

OptData opt_data(const config::Config& config) {
  OptData d;
  d.instructions = config.get_string("data.kind") == "instructions";
  d.tokenizer = config.get_string("data.tokenizer");
  if (d.tokenizer.empty()) d.tokenizer = train::init_from(config);
  d.train = config.get_string("data.train");
  d.val = config.get_string("data.val");
  d.text = config.get_string("data.text");
  d.dir = config.get_string("data.dir");
  d.train_tokens = (fs::path(d.dir) / "train.tok").string();
  d.val_tokens = (fs::path(d.dir) / "val.tok").string();
  d.val_every = config.get_int("data.val_every");
  d.context = config.get_int("data.context");
  d.pack = config.get_bool("data.pack");
  d.eos_after_lines = config.get_bool("data.eos_after_lines");
  d.chat_template = config.get_bool("data.chat_template");
  return d;
}

io::BpeTokenizer load_tokenizer(const config::Config& config, const OptData& data) {
  const std::string& folder = data.tokenizer;
  if (folder.empty()) config.fail_at("data.tokenizer", "is empty and model.init_from names no folder: give a tokenizer folder");
  if (!fs::is_directory(folder)) config.fail_at("data.tokenizer", "= " + folder + " is not a folder");
  return io::BpeTokenizer::from_folder(folder);
}

LmShape::SpecialIds special_ids(const config::Config& config, const OptData& data, const io::BpeTokenizer& tokenizer,
                                const LmShape& shape) {
  try {
    return shape.special_ids(tokenizer, "data.tokenizer = " + data.tokenizer);
  } catch (const Error& e) {
    config.fail_at("data.tokenizer", std::string("cannot frame examples: ") + e.what());
  }
}

io::InstructionFormat instruction_format(const config::Config& config, const OptData& data,
                                         const io::BpeTokenizer& tokenizer, const LmShape& shape) {
  const LmShape::SpecialIds ids = special_ids(config, data, tokenizer, shape);
  io::InstructionFormat format;
  format.bos = ids.bos;
  format.eos = ids.eos;
  if (data.chat_template && !data.tokenizer.empty()) {
    try {
      if (io::use_folder_template(format, data.tokenizer, tokenizer)) {
        log::infof("data: conversations framed by ", data.tokenizer, "'s chat template, each answer ending with token ", format.eos,
                   " (\"", tokenizer.decode({format.eos}), "\")");
      }
    } catch (const Error& e) {
      config.fail_at("data.chat_template", std::string("the tokenizer folder's chat template cannot frame examples: ") + e.what() +
                                               "; set data.chat_template = false for the plain framing");
    }
  }
  if (const std::string folder = train::init_from(config); !folder.empty()) {
    try {
      format.also_stop = io::generation_eos_ids(folder);
    } catch (const Error& e) {
      config.fail_at("model.init_from", e.what());
    }
  }
  format.max_tokens = data.context;
  return format;
}

namespace {

void check_fits_positions(const config::Config& config, const LmShape& m) {
  if (const int64_t context = config.get_int("data.context"); context > m.positions()) {
    config.fail_at("data.context", "(" + std::to_string(context) + ") exceeds the model's " + std::to_string(m.positions()) +
                                       " positions");
  }
}

// A GPT-2 or Llama-family folder gives the whole shape: the OPT keys that would describe another are
// refused by name.
void refuse_opt_shape_keys(const config::Config& config, const std::string& folder, const std::string& family) {
  for (const char* key : {"model.shape", "model.vocab_size", "model.hidden_size", "model.num_hidden_layers",
                          "model.num_attention_heads", "model.ffn_dim", "model.max_position_embeddings",
                          "model.word_embed_proj_dim", "model.do_layer_norm_before"}) {
    if (config.is_set(key)) {
      config.fail_at(key, "describes an OPT, but model.init_from = " + folder + " is a " + family +
                              " folder whose config.json gives the shape; remove the key");
    }
  }
}

// The one dropout rate GPT-2 has is model.dropout (model.attention_dropout must agree).
gpt::GPTConfig gpt2_init_config(const config::Config& config, const std::string& folder, const nlohmann::json& json) {
  gpt::GPTConfig c = std::get<gpt::GPTConfig>(read_lm_shape(json, folder + "/config.json").config);
  refuse_opt_shape_keys(config, folder, "GPT-2");
  if (config.is_set("model.dropout")) c.dropout = config.get_float("model.dropout");
  if (config.is_set("model.attention_dropout") && config.get_float("model.attention_dropout") != c.dropout) {
    config.fail_at("model.attention_dropout", "differs from the dropout rate (" + std::to_string(c.dropout) +
                                                  "); GPT-2 has one rate for embeddings, attention and residual branches");
  }
  return c;
}

// The Llama family's one dropout rate is on the attention probabilities (model.attention_dropout); it has
// no residual dropout to set.
LlamaConfig llama_init_config(const config::Config& config, const std::string& folder, const nlohmann::json& json) {
  LlamaConfig c = std::get<LlamaConfig>(read_lm_shape(json, folder + "/config.json").config);
  refuse_opt_shape_keys(config, folder, c.family());
  if (config.is_set("model.dropout") && config.get_float("model.dropout") != 0) {
    config.fail_at("model.dropout", "is set, but " + c.family() + " has no residual dropout; model.attention_dropout sets its one rate");
  }
  if (config.is_set("model.attention_dropout")) c.attention_dropout = config.get_float("model.attention_dropout");
  return c;
}

}  // namespace

LmShape model_config(const config::Config& config) { return model_config(config, opt_data(config)); }

LmShape model_config(const config::Config& config, const OptData& data) {
  if (const std::string folder = train::init_from(config); !folder.empty()) {
    const nlohmann::json json = io::read_hf_config(folder);
    const std::string type = json.contains("model_type") && json["model_type"].is_string() ? json["model_type"].get<std::string>() : "";
    if (type == "gpt2" || is_llama_family(type)) {
      const LmShape shape = type == "gpt2" ? LmShape(gpt2_init_config(config, folder, json)) : LmShape(llama_init_config(config, folder, json));
      check_fits_positions(config, shape);
      return shape;
    }
  }
  if (std::optional<OPTConfig> folder = opt_format().init_config(config)) {
    check_fits_positions(config, *folder);  // the folder gives the shape; a fine-tune may change the dropout rates
    return *folder;
  }
  OPTConfig m;
  if (const std::string shape = config.get_string("model.shape"); !shape.empty()) {
    try {
      m = opt_shape(shape);
    } catch (const Error& e) {
      config.fail_at("model.shape", e.what());
    }
  } else {
    opt_format().numbers.read_config(config, m);
    if (m.word_embed_proj_dim == 0) m.word_embed_proj_dim = m.hidden_size;
    if (m.hidden_size % m.num_attention_heads != 0) {
      config.fail_at("model.num_attention_heads", "(" + std::to_string(m.num_attention_heads) +
                                                      ") must divide model.hidden_size (" + std::to_string(m.hidden_size) + ")");
    }
  }
  // model.vocab_size when set; else a shape's own, or the tokenizer's rounded up to a multiple of 8.
  if (const int64_t vocab = config.get_int("model.vocab_size"); vocab > 0) {
    m.vocab_size = vocab;
  } else if (config.get_string("model.shape").empty()) {
    m.vocab_size = (load_tokenizer(config, data).vocab_size() + 7) / 8 * 8;
  }
  m.dropout = config.get_float("model.dropout");
  m.attention_dropout = config.get_float("model.attention_dropout");
  check_fits_positions(config, m);
  return m;
}

}  // namespace kuafu::opt

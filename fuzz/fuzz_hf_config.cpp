// Hugging Face config.json (core/io/hf_folder, core/train/hf_config_table): the bytes as a model
// folder's config.json, read with read_hf_config, then as GPT-2 and OPT shapes are read: each number
// through the app's row table (io::config_value / config_required) and checked against the bounds of
// its model.* key, as apps/gpt/hugging_face.cpp and apps/opt_finetune/hugging_face.cpp do.
#include <torch/torch.h>

#include "core/train/hf_config_table.h"
#include "fuzz/fuzz_support.h"

namespace {

using kuafu::train::HfConfigTable;

struct GptShape {
  int64_t vocab_size = 0, n_positions = 0, n_embd = 0, n_layer = 0, n_head = 0;
  double layer_norm_epsilon = 0, dropout = 0;
};
struct OptShape {
  int64_t vocab_size = 0, hidden_size = 0, num_hidden_layers = 0, ffn_dim = 0, num_attention_heads = 0;
  int64_t max_position_embeddings = 0, word_embed_proj_dim = 0;
  bool do_layer_norm_before = true;
  double dropout = 0;
};

// The apps' bounds of the model.* keys the tables check against.
kuafu::config::Schema bounds() {
  kuafu::config::Schema s;
  s.add_int("model.vocab_size", 0, "").min(0).max(1 << 24);
  s.add_int("model.n_positions", 1024, "").min(1).max(1 << 20);
  s.add_int("model.n_embd", 768, "").min(1).max(1 << 18);
  s.add_int("model.n_layer", 12, "").min(1).max(100000);
  s.add_int("model.n_head", 12, "").min(1).max(1 << 12);
  s.add_float("model.dropout", 0.0, "").min(0).max(0.9);
  s.add_float("model.layer_norm_epsilon", 1e-5, "").min(0);
  s.add_int("model.hidden_size", 768, "").min(1).max(1 << 18);
  s.add_int("model.num_hidden_layers", 12, "").min(1).max(100000);
  s.add_int("model.num_attention_heads", 12, "").min(1).max(1 << 12);
  s.add_int("model.ffn_dim", 3072, "").min(1).max(1 << 20);
  s.add_int("model.max_position_embeddings", 2048, "").min(1).max(1 << 20);
  s.add_int("model.word_embed_proj_dim", 0, "").min(0).max(1 << 18);
  return s;
}

const HfConfigTable<GptShape>& gpt_table() {
  static const HfConfigTable<GptShape> table({
      {"vocab_size", &GptShape::vocab_size},
      {"n_positions", &GptShape::n_positions},
      {"n_embd", &GptShape::n_embd},
      {"n_layer", &GptShape::n_layer},
      {"n_head", &GptShape::n_head},
      {"layer_norm_epsilon", &GptShape::layer_norm_epsilon, 1e-5},
      {"resid_pdrop", &GptShape::dropout, 0.1, "model.dropout", true},
  });
  return table;
}

const HfConfigTable<OptShape>& opt_table() {
  static const HfConfigTable<OptShape> table({
      {"vocab_size", &OptShape::vocab_size},
      {"hidden_size", &OptShape::hidden_size},
      {"num_hidden_layers", &OptShape::num_hidden_layers},
      {"ffn_dim", &OptShape::ffn_dim},
      {"num_attention_heads", &OptShape::num_attention_heads},
      {"max_position_embeddings", &OptShape::max_position_embeddings, 2048},
      {"word_embed_proj_dim", &OptShape::word_embed_proj_dim, 0},
      {"do_layer_norm_before", &OptShape::do_layer_norm_before, 1},
      {"dropout", &OptShape::dropout, 0.1, "", true},
  });
  return table;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("hf_config");
  static const kuafu::config::Schema schema = bounds();
  const std::string where = scratch.write("config.json", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] {
    const nlohmann::json json = kuafu::io::read_hf_config(scratch.dir());
    kuafu::io::config_value<std::string>(json, "model_type", "", where);
    kuafu::io::config_value<std::string>(json, "activation_function", "gelu_new", where);
    kuafu::io::config_value<bool>(json, "tie_word_embeddings", true, where);
    kuafu::fuzz::expect_named_errors([&] {
      GptShape gpt;
      gpt_table().read_json(json, where, gpt);
      gpt_table().check_bounds(schema, where, gpt);
    });
    OptShape opt;
    opt_table().read_json(json, where, opt);
    opt_table().check_bounds(schema, where, opt);
  });
  return 0;
}

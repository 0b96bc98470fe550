#include "apps/opt_finetune/hugging_face.h"

#include "core/train/hf_interop.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::opt {

OPTConfig opt_config_from_hf(const nlohmann::json& config, const std::string& where) {
  const std::string type = io::config_value<std::string>(config, "model_type", "", where);
  KUAFU_CHECK(type == "opt", where, ": model_type \"", text::abbreviate(type), "\" is not OPT (\"opt\")");
  OPTConfig c;
  c.vocab_size = io::config_required<int64_t>(config, "vocab_size", where);
  c.hidden_size = io::config_required<int64_t>(config, "hidden_size", where);
  c.num_hidden_layers = io::config_required<int64_t>(config, "num_hidden_layers", where);
  c.ffn_dim = io::config_required<int64_t>(config, "ffn_dim", where);
  c.num_attention_heads = io::config_required<int64_t>(config, "num_attention_heads", where);
  c.max_position_embeddings = io::config_value<int64_t>(config, "max_position_embeddings", 2048, where);
  c.word_embed_proj_dim = io::config_value<int64_t>(config, "word_embed_proj_dim", c.hidden_size, where);
  c.do_layer_norm_before = io::config_value<bool>(config, "do_layer_norm_before", true, where);
  c.remove_final_layer_norm = io::config_value<bool>(config, "_remove_final_layer_norm", false, where);
  c.dropout = io::config_value<double>(config, "dropout", 0.1, where);
  c.attention_dropout = io::config_value<double>(config, "attention_dropout", 0.0, where);
  const std::string activation = io::config_value<std::string>(config, "activation_function", "relu", where);
  KUAFU_CHECK(activation == "relu", where, ": activation_function \"", text::abbreviate(activation), "\" is not OPT's ReLU");
  KUAFU_CHECK(io::config_value<bool>(config, "enable_bias", true, where), where, ": enable_bias = false is not supported");
  KUAFU_CHECK(io::config_value<bool>(config, "layer_norm_elementwise_affine", true, where), where,
              ": layer_norm_elementwise_affine = false is not supported");
  KUAFU_CHECK(io::config_value<bool>(config, "tie_word_embeddings", true, where), where,
              ": tie_word_embeddings = false is not supported (OPT's head is the token embedding)");
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where + ": " + e.what());
  }
  return c;
}

nlohmann::json hf_config(const OPTConfig& c) {
  return {{"model_type", "opt"},
          {"architectures", {"OPTForCausalLM"}},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"ffn_dim", c.ffn_dim},
          {"num_attention_heads", c.num_attention_heads},
          {"max_position_embeddings", c.max_position_embeddings},
          {"word_embed_proj_dim", c.word_embed_proj_dim},
          {"do_layer_norm_before", c.do_layer_norm_before},
          {"_remove_final_layer_norm", c.remove_final_layer_norm},
          {"dropout", c.dropout},
          {"attention_dropout", c.attention_dropout},
          {"activation_function", "relu"},
          {"enable_bias", true},
          {"layer_norm_elementwise_affine", true},
          {"init_std", 0.02},
          {"tie_word_embeddings", true},
          {"pad_token_id", 1},
          {"bos_token_id", 2},
          {"eos_token_id", 2},
          {"dtype", "float32"}};
}

void load_hf_weights(OPTForCausalLM& model, const io::HfFolder& folder) {
  train::load_pretrained(*model, model->tp, folder, [](const std::string& stored) -> std::optional<std::string> {
    if (stored == "lm_head.weight") return std::nullopt;  // a copy of the token embedding (checked below)
    return text::starts_with(stored, "model.") ? stored : "model." + stored;  // a bare OPTModel's "decoder.*"
  });
  train::check_tied_copy(folder, "lm_head.weight", {"model.decoder.embed_tokens.weight", "decoder.embed_tokens.weight"});
}

OPTForCausalLM load_hf_opt(const std::string& dir, torch::Device device) {
  const io::HfFolder folder = io::read_hf_folder(dir);
  OPTForCausalLM model(opt_config_from_hf(folder.config, dir + "/config.json"), parallel::TensorParallel::serial_on(device));
  load_hf_weights(model, folder);
  return model;
}

void export_hf_opt(OPTForCausalLM& model, const std::string& dir, const io::HfWriteOptions& options) {
  train::export_pretrained(*model, model->tp, dir, hf_config(model->config), options);
}

}  // namespace kuafu::opt

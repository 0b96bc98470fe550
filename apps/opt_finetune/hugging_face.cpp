#include "apps/opt_finetune/hugging_face.h"

#include "apps/opt_finetune/app_config.h"

namespace kuafu::opt {
namespace {

void check_opt_config(const nlohmann::json& config, const std::string& where, OPTConfig& c) {
  if (c.word_embed_proj_dim == 0) c.word_embed_proj_dim = c.hidden_size;
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
}

}  // namespace

const OptFormat& opt_format() {
  static const OptFormat format{
      "opt",
      "OPT",
      train::HfConfigTable<OPTConfig>({
          {"vocab_size", &OPTConfig::vocab_size},
          {"hidden_size", &OPTConfig::hidden_size},
          {"num_hidden_layers", &OPTConfig::num_hidden_layers},
          {"ffn_dim", &OPTConfig::ffn_dim},
          {"num_attention_heads", &OPTConfig::num_attention_heads},
          {"max_position_embeddings", &OPTConfig::max_position_embeddings, 2048},
          {"word_embed_proj_dim", &OPTConfig::word_embed_proj_dim, 0},  // 0: hidden_size
          {"do_layer_norm_before", &OPTConfig::do_layer_norm_before, 1},
          {"_remove_final_layer_norm", &OPTConfig::remove_final_layer_norm, 0, "-"},
          {"dropout", &OPTConfig::dropout, 0.1, "", /*tunable=*/true},
          {"attention_dropout", &OPTConfig::attention_dropout, 0.0, "", /*tunable=*/true},
      }),
      {{"architectures", {"OPTForCausalLM"}},
       {"activation_function", "relu"},
       {"enable_bias", true},
       {"layer_norm_elementwise_affine", true},
       {"init_std", 0.02},
       {"tie_word_embeddings", true},
       {"pad_token_id", 1},
       {"bos_token_id", 2},
       {"eos_token_id", 2},
       {"dtype", "float32"}},
      check_opt_config,
      // lm_head.weight is a copy of the token embedding.
      {"model.", {}, {}, {}, "lm_head.weight", "model.decoder.embed_tokens.weight"},
      opt_schema,
  };
  return format;
}

}  // namespace kuafu::opt

#include "apps/gpt/hugging_face.h"

#include "apps/gpt/app_config.h"

namespace kuafu::gpt {
namespace {

void check_gpt_config(const nlohmann::json& config, const std::string& where, GPTConfig& c) {
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size}, {"n_positions", c.n_positions},
                               {"n_embd", c.n_embd}, {"n_layer", c.n_layer}, {"n_head", c.n_head}}) {
    KUAFU_CHECK(v > 0, where, ": \"", key, "\" = ", v, " must be positive");
  }
  KUAFU_CHECK(c.n_embd % c.n_head == 0, where, ": n_head = ", c.n_head, " does not divide n_embd = ", c.n_embd);
  // Kuafu's GPT-2 computes exactly these; anything else would load and silently compute another model.
  const std::string activation = io::config_value<std::string>(config, "activation_function", "gelu_new", where);
  KUAFU_CHECK(activation == "gelu_new" || activation == "gelu_pytorch_tanh", where, ": activation_function \"",
              text::abbreviate(activation), "\" is not GPT-2's tanh GELU (gelu_new)");
  const int64_t inner = io::config_value<int64_t>(config, "n_inner", 4 * c.n_embd, where);
  KUAFU_CHECK(inner == 4 * c.n_embd, where, ": n_inner = ", inner, " but Kuafu's GPT-2 MLP is 4 n_embd = ", 4 * c.n_embd);
  KUAFU_CHECK(!io::config_value<bool>(config, "scale_attn_by_inverse_layer_idx", false, where), where,
              ": scale_attn_by_inverse_layer_idx = true is not supported");
  KUAFU_CHECK(io::config_value<bool>(config, "scale_attn_weights", true, where), where,
              ": scale_attn_weights = false is not supported");
  KUAFU_CHECK(io::config_value<bool>(config, "tie_word_embeddings", true, where), where,
              ": tie_word_embeddings = false is not supported (GPT-2's head is the token embedding)");
  const double resid = io::config_value<double>(config, "resid_pdrop", 0.1, where);
  const double embd = io::config_value<double>(config, "embd_pdrop", 0.1, where);
  const double attn = io::config_value<double>(config, "attn_pdrop", 0.1, where);
  KUAFU_CHECK(resid == embd && embd == attn, where, ": resid_pdrop, embd_pdrop and attn_pdrop (", resid, ", ", embd,
              ", ", attn, ") differ; Kuafu's GPT-2 has one dropout rate (model.dropout)");
  c.dropout = resid;
}

}  // namespace

const GptFormat& gpt_format() {
  static const GptFormat format{
      "gpt2",
      "GPT-2",
      train::HfConfigTable<GPTConfig>({
          {"vocab_size", &GPTConfig::vocab_size},
          {"n_positions", &GPTConfig::n_positions},
          {"n_embd", &GPTConfig::n_embd},
          {"n_layer", &GPTConfig::n_layer},
          {"n_head", &GPTConfig::n_head},
          {"layer_norm_epsilon", &GPTConfig::layer_norm_epsilon, 1e-5},
          // One rate for the three dropouts (check_gpt_config refuses a folder whose rates differ).
          {"resid_pdrop", &GPTConfig::dropout, 0.1, "model.dropout", /*tunable=*/true},
          {"embd_pdrop", &GPTConfig::dropout, 0.1, "-"},
          {"attn_pdrop", &GPTConfig::dropout, 0.1, "-"},
      }),
      {{"architectures", {"GPT2LMHeadModel"}},
       {"n_inner", nullptr},
       {"activation_function", "gelu_new"},
       {"initializer_range", 0.02},
       {"scale_attn_weights", true},
       {"tie_word_embeddings", true},
       {"dtype", "float32"}},
      check_gpt_config,
      // The head is the token embedding (safetensors refuses a second copy of shared storage, so
      // transformers stores it once); old GPT-2 files also hold the causal-mask buffers.
      {"transformer.", {}, {}, {".attn.bias", ".attn.masked_bias"}, "lm_head.weight", "transformer.wte.weight"},
      gpt_schema,
  };
  return format;
}

}  // namespace kuafu::gpt

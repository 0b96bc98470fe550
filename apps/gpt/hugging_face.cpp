#include "apps/gpt/hugging_face.h"

#include "core/train/hf_interop.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::gpt {

GPTConfig gpt_config_from_hf(const nlohmann::json& config, const std::string& where) {
  const std::string type = io::config_value<std::string>(config, "model_type", "", where);
  KUAFU_CHECK(type == "gpt2", where, ": model_type \"", text::abbreviate(type), "\" is not GPT-2 (\"gpt2\")");
  GPTConfig c;
  c.vocab_size = io::config_required<int64_t>(config, "vocab_size", where);
  c.n_positions = io::config_required<int64_t>(config, "n_positions", where);
  c.n_embd = io::config_required<int64_t>(config, "n_embd", where);
  c.n_layer = io::config_required<int64_t>(config, "n_layer", where);
  c.n_head = io::config_required<int64_t>(config, "n_head", where);
  for (const auto& [key, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size}, {"n_positions", c.n_positions},
                               {"n_embd", c.n_embd}, {"n_layer", c.n_layer}, {"n_head", c.n_head}}) {
    KUAFU_CHECK(v > 0, where, ": \"", key, "\" = ", v, " must be positive");
  }
  KUAFU_CHECK(c.n_embd % c.n_head == 0, where, ": n_head = ", c.n_head, " does not divide n_embd = ", c.n_embd);
  c.layer_norm_epsilon = io::config_value<double>(config, "layer_norm_epsilon", 1e-5, where);
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
  return c;
}

nlohmann::json hf_config(const GPTConfig& c) {
  return {{"model_type", "gpt2"},
          {"architectures", {"GPT2LMHeadModel"}},
          {"vocab_size", c.vocab_size},
          {"n_positions", c.n_positions},
          {"n_embd", c.n_embd},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", c.layer_norm_epsilon},
          {"resid_pdrop", c.dropout},
          {"embd_pdrop", c.dropout},
          {"attn_pdrop", c.dropout},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"tie_word_embeddings", true},
          {"dtype", "float32"}};
}

void load_hf_weights(GPT& model, const io::HfFolder& folder) {
  train::load_pretrained(*model, model->tp, folder, [](const std::string& stored) -> std::optional<std::string> {
    // The head is the token embedding (safetensors refuses a second copy of shared storage, so
    // transformers stores it once); old GPT-2 files also hold the causal-mask buffers.
    if (stored == "lm_head.weight" || text::ends_with(stored, ".attn.bias") || text::ends_with(stored, ".attn.masked_bias")) {
      return std::nullopt;
    }
    return text::starts_with(stored, "transformer.") ? stored : "transformer." + stored;  // a bare GPT2Model
  });
  train::check_tied_copy(folder, "lm_head.weight", {"transformer.wte.weight", "wte.weight"});
}

GPT load_hf_gpt(const std::string& dir, torch::Device device) {
  const io::HfFolder folder = io::read_hf_folder(dir);
  GPT model(gpt_config_from_hf(folder.config, dir + "/config.json"), parallel::TensorParallel::serial_on(device));
  load_hf_weights(model, folder);
  return model;
}

void export_hf_gpt(GPT& model, const std::string& dir, const io::HfWriteOptions& options) {
  train::export_pretrained(*model, model->tp, dir, hf_config(model->config), options);
}

}  // namespace kuafu::gpt

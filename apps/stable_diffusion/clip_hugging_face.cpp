#include "apps/stable_diffusion/clip_hugging_face.h"

namespace kuafu::sd {
namespace {

std::string activation_name(nn::Activation activation) { return activation == nn::Activation::kGelu ? "gelu" : "quick_gelu"; }

void check_clip_config(const nlohmann::json& config, const std::string& where, ClipTextConfig& c) {
  const std::string act = io::config_value<std::string>(config, "hidden_act", "quick_gelu", where);
  KUAFU_CHECK(act == "quick_gelu" || act == "gelu", where, ": hidden_act \"", text::abbreviate(act),
              "\" is not CLIP's quick_gelu or gelu");
  c.hidden_act = act == "gelu" ? nn::Activation::kGelu : nn::Activation::kQuickGelu;
  // Every CLIPTextConfig carries a projection_dim; only CLIPTextModelWithProjection (SDXL's second encoder) has
  // the projection, which its architectures name.
  const nlohmann::json architectures = config.value("architectures", nlohmann::json::array());
  c.with_projection = architectures.is_array() && architectures.size() == 1 && architectures[0] == "CLIPTextModelWithProjection";
  c.projection_dim = io::config_value<int64_t>(config, "projection_dim", 512, where);
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where + ": " + e.what());
  }
}

}  // namespace

const ClipTextFormat& clip_text_format() {
  static const ClipTextFormat format{
      "clip_text_model",
      "CLIP's text encoder",
      train::HfConfigTable<ClipTextConfig>({
          {"vocab_size", &ClipTextConfig::vocab_size},
          {"hidden_size", &ClipTextConfig::hidden_size},
          {"intermediate_size", &ClipTextConfig::intermediate_size},
          {"num_hidden_layers", &ClipTextConfig::num_hidden_layers},
          {"num_attention_heads", &ClipTextConfig::num_attention_heads},
          {"max_position_embeddings", &ClipTextConfig::max_position_embeddings, 77},
          {"layer_norm_eps", &ClipTextConfig::layer_norm_eps, 1e-5},
          {"eos_token_id", &ClipTextConfig::eos_token_id, 2},
      }),
      {{"architectures", {"CLIPTextModel"}}, {"attention_dropout", 0.0}, {"dropout", 0.0}, {"dtype", "float32"}},
      check_clip_config,
      {"text_model.", {"text_projection."}, {}, {"position_ids"}, "", ""},
  };
  return format;
}

void save_clip_text_model(ClipTextModel& model, const std::string& dir, const io::HfWriteOptions& options) {
  nlohmann::json config = clip_text_format().write_config(model->config);
  config["hidden_act"] = activation_name(model->config.hidden_act);
  if (model->config.with_projection) {
    config["architectures"] = {"CLIPTextModelWithProjection"};
    config["projection_dim"] = model->config.projection_dim;
  }
  train::export_pretrained(*model, model->tp, dir, config, options);
}

}  // namespace kuafu::sd

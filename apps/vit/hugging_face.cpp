#include "apps/vit/hugging_face.h"

#include "apps/vit/app_config.h"

namespace kuafu::vit {
namespace {

void check_vit_config(const nlohmann::json& config, const std::string& where, ViTConfig& c) {
  const auto labels = config.find("id2label");
  c.num_labels = labels != config.end() && labels->is_object() ? static_cast<int64_t>(labels->size())
                                                               : io::config_value<int64_t>(config, "num_labels", 2, where);
  const std::string activation = io::config_value<std::string>(config, "hidden_act", "gelu", where);
  KUAFU_CHECK(activation == "gelu", where, ": hidden_act \"", text::abbreviate(activation),
              "\" is not ViT's exact GELU (\"gelu\")");
  KUAFU_CHECK(io::config_value<bool>(config, "qkv_bias", true, where), where, ": qkv_bias = false is not supported");
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where + ": " + e.what());
  }
}

}  // namespace

const VitFormat& vit_format() {
  static const VitFormat format{
      "vit",
      "ViT",
      train::HfConfigTable<ViTConfig>({
          {"hidden_size", &ViTConfig::hidden_size},
          {"num_hidden_layers", &ViTConfig::num_hidden_layers},
          {"num_attention_heads", &ViTConfig::num_attention_heads},
          {"intermediate_size", &ViTConfig::intermediate_size},
          {"image_size", &ViTConfig::image_size, 224},
          {"patch_size", &ViTConfig::patch_size, 16},
          {"num_channels", &ViTConfig::num_channels, 3},
          {"hidden_dropout_prob", &ViTConfig::hidden_dropout_prob, 0.0, "", /*tunable=*/true},
          {"attention_probs_dropout_prob", &ViTConfig::attention_probs_dropout_prob, 0.0, "", /*tunable=*/true},
          {"layer_norm_eps", &ViTConfig::layer_norm_eps, 1e-12},
      }),
      {{"architectures", {"ViTForImageClassification"}},
       {"hidden_act", "gelu"},
       {"qkv_bias", true},
       {"initializer_range", 0.02},
       {"dtype", "float32"}},
      check_vit_config,
      // A bare ViTModel's names lack the "vit." of the classification model; its pooler is unused here.
      {"vit.", {"classifier."}, {"vit.pooler."}, {}, "", ""},
      vit_schema,
  };
  return format;
}

nlohmann::json hf_config(const ViTConfig& c, const std::vector<std::string>& class_names) {
  KUAFU_CHECK(class_names.empty() || static_cast<int64_t>(class_names.size()) == c.num_labels, "the export names ",
              class_names.size(), " classes but the model has ", c.num_labels, " labels");
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (int64_t i = 0; i < c.num_labels; ++i) {
    const std::string name = class_names.empty() ? "LABEL_" + std::to_string(i) : class_names[static_cast<size_t>(i)];
    id2label[std::to_string(i)] = name;
    label2id[name] = i;
  }
  nlohmann::json json = vit_format().write_config(c);
  json.update({{"id2label", id2label}, {"label2id", label2id}});
  return json;
}

void load_hf_weights(ViTForImageClassification& model, const io::HfFolder& folder, bool fresh_classifier) {
  train::HfWeightNames names = vit_format().names;
  if (fresh_classifier) names.fresh_prefixes = {"classifier."};
  train::load_pretrained(*model, model->tp, folder, names);
}

void export_hf_vit(ViTForImageClassification& model, const std::string& dir, const std::vector<std::string>& class_names,
                   const io::HfWriteOptions& options) {
  train::export_pretrained(*model, model->tp, dir, hf_config(model->config, class_names), options);
}

}  // namespace kuafu::vit

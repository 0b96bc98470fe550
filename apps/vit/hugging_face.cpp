#include "apps/vit/hugging_face.h"

#include "core/train/hf_interop.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::vit {

ViTConfig vit_config_from_hf(const nlohmann::json& config, const std::string& where) {
  const std::string type = io::config_value<std::string>(config, "model_type", "", where);
  KUAFU_CHECK(type == "vit", where, ": model_type \"", text::abbreviate(type), "\" is not ViT (\"vit\")");
  ViTConfig c;
  c.hidden_size = io::config_required<int64_t>(config, "hidden_size", where);
  c.num_hidden_layers = io::config_required<int64_t>(config, "num_hidden_layers", where);
  c.num_attention_heads = io::config_required<int64_t>(config, "num_attention_heads", where);
  c.intermediate_size = io::config_required<int64_t>(config, "intermediate_size", where);
  c.image_size = io::config_value<int64_t>(config, "image_size", 224, where);
  c.patch_size = io::config_value<int64_t>(config, "patch_size", 16, where);
  c.num_channels = io::config_value<int64_t>(config, "num_channels", 3, where);
  c.hidden_dropout_prob = io::config_value<double>(config, "hidden_dropout_prob", 0.0, where);
  c.attention_probs_dropout_prob = io::config_value<double>(config, "attention_probs_dropout_prob", 0.0, where);
  c.layer_norm_eps = io::config_value<double>(config, "layer_norm_eps", 1e-12, where);
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
  return c;
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
  return {{"model_type", "vit"},
          {"architectures", {"ViTForImageClassification"}},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"intermediate_size", c.intermediate_size},
          {"hidden_act", "gelu"},
          {"hidden_dropout_prob", c.hidden_dropout_prob},
          {"attention_probs_dropout_prob", c.attention_probs_dropout_prob},
          {"layer_norm_eps", c.layer_norm_eps},
          {"image_size", c.image_size},
          {"patch_size", c.patch_size},
          {"num_channels", c.num_channels},
          {"qkv_bias", true},
          {"initializer_range", 0.02},
          {"id2label", id2label},
          {"label2id", label2id},
          {"dtype", "float32"}};
}

void load_hf_weights(ViTForImageClassification& model, const io::HfFolder& folder, bool fresh_classifier) {
  auto is_classifier = [](const std::string& name) { return text::starts_with(name, "classifier."); };
  train::load_pretrained(
      *model, model->tp, folder,
      [&](const std::string& stored) -> std::optional<std::string> {
        if (text::starts_with(stored, "vit.pooler.") || (fresh_classifier && is_classifier(stored))) return std::nullopt;
        // A bare ViTModel's names lack the "vit." of the classification model.
        return text::starts_with(stored, "vit.") || is_classifier(stored) ? stored : "vit." + stored;
      },
      [&](const std::string& name) { return fresh_classifier && is_classifier(name); });
}

ViTForImageClassification load_hf_vit(const std::string& dir, torch::Device device) {
  const io::HfFolder folder = io::read_hf_folder(dir);
  ViTForImageClassification model(vit_config_from_hf(folder.config, dir + "/config.json"),
                                  parallel::TensorParallel::serial_on(device));
  load_hf_weights(model, folder);
  return model;
}

void export_hf_vit(ViTForImageClassification& model, const std::string& dir, const std::vector<std::string>& class_names,
                   const io::HfWriteOptions& options) {
  train::export_pretrained(*model, model->tp, dir, hf_config(model->config, class_names), options);
}

}  // namespace kuafu::vit

#include "apps/opt_finetune/llama_hugging_face.h"

#include <map>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::opt {
namespace {

const char* const kFamily[] = {"llama", "qwen2", "qwen3", "mistral"};

// rope_parameters (transformers 5) or rope_scaling beside rope_theta (older folders): the schedule and
// its numbers. The head width and context come from the sizes.
nn::RotarySpec read_rope(const nlohmann::json& json, const std::string& where, const LlamaConfig& c) {
  nlohmann::json params = nlohmann::json::object();
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (json.contains(key) && !json[key].is_null()) {
      KUAFU_CHECK(json[key].is_object(), where, ": \"", key, "\" must be an object");
      params = json[key];
      break;
    }
  }
  const std::string at = where + ": rope_parameters";
  nn::RotarySpec rope;
  rope.head_dim = c.head_dim;
  rope.max_positions = c.max_position_embeddings;
  rope.theta = io::config_value<double>(params, "rope_theta", io::config_value<double>(json, "rope_theta", 10000.0, where), at);
  rope.type = io::config_value<std::string>(params, "rope_type", io::config_value<std::string>(params, "type", "default", at), at);
  const double partial = io::config_value<double>(params, "partial_rotary_factor",
                                                  io::config_value<double>(json, "partial_rotary_factor", 1.0, where), at);
  KUAFU_CHECK(partial == 1.0, at, ": partial_rotary_factor ", partial, " is not supported (Kuafu rotates every feature of a head)");
  if (rope.type != "default") rope.factor = io::config_required<double>(params, "factor", at);
  if (rope.type == "llama3") {
    rope.low_freq_factor = io::config_required<double>(params, "low_freq_factor", at);
    rope.high_freq_factor = io::config_required<double>(params, "high_freq_factor", at);
    rope.original_max_positions = io::config_value<int64_t>(
        params, "original_max_position_embeddings",
        io::config_value<int64_t>(json, "original_max_position_embeddings", c.max_position_embeddings, where), at);
  }
  nn::validate(rope, at + ": ");
  return rope;
}

nlohmann::json write_rope(const nn::RotarySpec& rope) {
  nlohmann::json params = {{"rope_type", rope.type}, {"rope_theta", rope.theta}};
  if (rope.type != "default") params["factor"] = rope.factor;
  if (rope.type == "llama3") {
    params["low_freq_factor"] = rope.low_freq_factor;
    params["high_freq_factor"] = rope.high_freq_factor;
    params["original_max_position_embeddings"] = rope.original_max_positions;
  }
  return params;
}

// Which layers slide, and by how much: Mistral's sliding_window covers every layer; Qwen's only when
// use_sliding_window, the layers layer_types names (or those from max_window_layers on).
void read_sliding(const nlohmann::json& json, const std::string& where, LlamaConfig& c) {
  if (c.model_type == "llama") return;
  const int64_t window = io::config_value<int64_t>(json, "sliding_window", 0, where);
  if (c.model_type == "mistral") {
    c.sliding_window = window;
    return;
  }
  const bool used = io::config_value<bool>(json, "use_sliding_window", false, where);
  c.sliding_window = used ? window : 0;
  if (json.contains("layer_types") && !json["layer_types"].is_null()) {
    const auto types = io::config_value<std::vector<std::string>>(json, "layer_types", {}, where);
    for (const std::string& type : types) {
      KUAFU_CHECK(type == "full_attention" || type == "sliding_attention", where, ": layer_types holds \"", text::abbreviate(type),
                  "\", not full_attention or sliding_attention");
      c.sliding_layers.push_back(type == "sliding_attention");
    }
  } else {
    const int64_t first = io::config_value<int64_t>(json, "max_window_layers", 28, where);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.sliding_layers.push_back(c.sliding_window > 0 && i >= first);
  }
}

void finish_llama_config(const nlohmann::json& json, const std::string& where, LlamaConfig& c) {
  c.model_type = io::config_value<std::string>(json, "model_type", "", where);
  const std::string activation = io::config_value<std::string>(json, "hidden_act", "silu", where);
  KUAFU_CHECK(activation == "silu", where, ": hidden_act \"", text::abbreviate(activation), "\" is not the family's SiLU");
  KUAFU_CHECK(!json.contains("quantization_config"), where, ": quantization_config: quantised weights are not supported");
  KUAFU_CHECK(c.num_attention_heads > 0, where, ": num_attention_heads must be positive");
  c.num_key_value_heads = io::config_value<int64_t>(json, "num_key_value_heads", c.num_attention_heads, where);
  // Qwen3's head width is its own (128 unless given); the others' is hidden / heads unless given.
  c.head_dim = io::config_value<int64_t>(json, "head_dim", c.model_type == "qwen3" ? 128 : c.hidden_size / c.num_attention_heads, where);
  if (c.model_type == "llama" || c.model_type == "qwen3") c.attention_bias = io::config_value<bool>(json, "attention_bias", false, where);
  if (c.model_type == "llama") c.mlp_bias = io::config_value<bool>(json, "mlp_bias", false, where);
  c.rope = read_rope(json, where, c);
  read_sliding(json, where, c);
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (json.contains(key) && !json[key].is_null()) c.token_ids[key] = json[key];
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where + ": " + e.what());
  }
}

void write_llama_rest(const LlamaConfig& c, nlohmann::json& json) {
  json["architectures"] = {c.architecture()};
  json["num_key_value_heads"] = c.num_key_value_heads;
  json["head_dim"] = c.head_dim;
  json["rope_parameters"] = write_rope(c.rope);
  if (c.model_type == "llama" || c.model_type == "qwen3") json["attention_bias"] = c.attention_bias;
  if (c.model_type == "llama") json["mlp_bias"] = c.mlp_bias;
  if (c.model_type == "mistral") json["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json();
  if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    json["use_sliding_window"] = c.sliding_window > 0;
    json["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json();
    nlohmann::json types = nlohmann::json::array();
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const bool slides = !c.sliding_layers.empty() && c.sliding_layers[static_cast<size_t>(i)];
      types.push_back(slides ? "sliding_attention" : "full_attention");
    }
    json["layer_types"] = types;
  }
  json.update(c.token_ids);
}

train::HfWeightNames llama_names(const LlamaConfig& c) {
  // An untied head is the model's own tensor; a tied one is stored once or as an equal copy.
  if (c.tie_word_embeddings) return {"model.", {}, {}, {".rotary_emb.inv_freq"}, "lm_head.weight", "model.embed_tokens.weight"};
  return {"model.", {"lm_head."}, {}, {".rotary_emb.inv_freq"}, "", ""};
}

LlamaFormat make_format(const std::string& model_type) {
  LlamaConfig named;
  named.model_type = model_type;
  LlamaFormat format{
      model_type,
      named.family(),
      train::HfConfigTable<LlamaConfig>({
          {"vocab_size", &LlamaConfig::vocab_size, std::nullopt, "-"},
          {"hidden_size", &LlamaConfig::hidden_size, std::nullopt, "-"},
          {"intermediate_size", &LlamaConfig::intermediate_size, std::nullopt, "-"},
          {"num_hidden_layers", &LlamaConfig::num_hidden_layers, std::nullopt, "-"},
          {"num_attention_heads", &LlamaConfig::num_attention_heads, std::nullopt, "-"},
          {"max_position_embeddings", &LlamaConfig::max_position_embeddings, std::nullopt, "-"},
          {"rms_norm_eps", &LlamaConfig::rms_norm_eps, 1e-6, "-"},
          {"attention_dropout", &LlamaConfig::attention_dropout, 0.0, "-"},
          {"tie_word_embeddings", &LlamaConfig::tie_word_embeddings, 0, "-"},
      }),
      {{"hidden_act", "silu"}, {"dtype", "float32"}},
      finish_llama_config,
      llama_names(named),
  };
  format.write_rest = write_llama_rest;
  format.names_of = llama_names;
  return format;
}

}  // namespace

bool is_llama_family(const std::string& model_type) {
  for (const char* type : kFamily) {
    if (model_type == type) return true;
  }
  return false;
}

const LlamaFormat& llama_format(const std::string& model_type) {
  static const std::map<std::string, LlamaFormat> formats = [] {
    std::map<std::string, LlamaFormat> made;
    for (const char* type : kFamily) made.emplace(type, make_format(type));
    return made;
  }();
  const auto found = formats.find(model_type);
  KUAFU_CHECK(found != formats.end(), "model_type \"", text::abbreviate(model_type), "\" is not of the Llama family (llama, qwen2, qwen3, mistral)");
  return found->second;
}

}  // namespace kuafu::opt

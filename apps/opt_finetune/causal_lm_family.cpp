#include "apps/opt_finetune/causal_lm_family.h"

#include <sstream>

#include "apps/gpt/hugging_face.h"
#include "apps/opt_finetune/hugging_face.h"
#include "apps/opt_finetune/llama_hugging_face.h"
#include "core/train/lazy_model.h"

namespace kuafu::opt {

namespace {

// Calls `f` with the family's format and shape.
template <class F>
auto with_format(const LmShape& shape, F&& f) {
  if (const auto* gpt2 = std::get_if<gpt::GPTConfig>(&shape.config)) return f(gpt::gpt_format(), *gpt2);
  if (const auto* llama = std::get_if<LlamaConfig>(&shape.config)) return f(llama_format(llama->model_type), *llama);
  return f(opt_format(), std::get<OPTConfig>(shape.config));
}

}  // namespace

std::string LmShape::family() const {
  if (const auto* llama = std::get_if<LlamaConfig>(&config)) return llama->family();
  return is_gpt2() ? "GPT-2" : "OPT";
}

LmShape::SpecialIds LmShape::special_ids(const io::BpeTokenizer& tokenizer, const std::string& where) const {
  if (const auto* llama = std::get_if<LlamaConfig>(&config)) {
    auto id_of = [&](const char* key) -> std::optional<int64_t> {
      if (!llama->token_ids.contains(key)) return std::nullopt;
      const nlohmann::json& value = llama->token_ids[key];
      const nlohmann::json& first = value.is_array() && !value.empty() ? value[0] : value;
      if (!first.is_number_integer()) return std::nullopt;
      return first.get<int64_t>();
    };
    const std::optional<int64_t> eos = id_of("eos_token_id");
    KUAFU_CHECK(eos, "the ", llama->family(), " folder's config.json has no eos_token_id: Kuafu ends every response with it");
    KUAFU_CHECK(*eos >= 0 && *eos < tokenizer.vocab_size(), where, ": the tokenizer has no id ", *eos, ", the ", llama->family(),
                " folder's EOS");
    // The BOS the tokenizer puts before a text, as transformers' tokenizer(text) and so trl frame it: Llama 2's
    // and 3's one token, none for Qwen's.
    const std::vector<int64_t>& before = tokenizer.added_before();
    KUAFU_CHECK(before.size() <= 1, where, ": the tokenizer puts ", before.size(), " tokens before a text; the plain framing "
                "begins an example with one BOS at most (give the folder a chat template)");
    return {before.empty() ? std::nullopt : std::optional<int64_t>(before.front()), *eos};
  }
  const std::string token = is_gpt2() ? "<|endoftext|>" : "</s>";
  const std::optional<int64_t> id = tokenizer.token_id(token);
  KUAFU_CHECK(id, where, ": the tokenizer has no \"", token, "\", ", family(), "'s BOS and EOS");
  return {*id, *id};
}

std::string LmShape::classifier_architecture() const {
  return (is_gpt2() ? std::string("GPT2") : family()) + "ForSequenceClassification";
}

int64_t LmShape::parameter_count() const {
  return std::visit([](const auto& c) { return c.parameter_count(); }, config);
}

double LmShape::flops_per_token(int64_t t) const {
  return std::visit([t](const auto& c) { return c.flops_per_token(t); }, config);
}

int64_t LmShape::vocab_size() const {
  return std::visit([](const auto& c) { return c.vocab_size; }, config);
}

int64_t LmShape::positions() const {
  if (const auto* gpt2 = std::get_if<gpt::GPTConfig>(&config)) return gpt2->n_positions;
  if (const auto* llama = std::get_if<LlamaConfig>(&config)) return llama->context();
  return std::get<OPTConfig>(config).max_position_embeddings;
}

int64_t LmShape::layers() const {
  if (const auto* gpt2 = std::get_if<gpt::GPTConfig>(&config)) return gpt2->n_layer;
  if (const auto* llama = std::get_if<LlamaConfig>(&config)) return llama->num_hidden_layers;
  return std::get<OPTConfig>(config).num_hidden_layers;
}

int64_t LmShape::final_width() const {
  if (const auto* gpt2 = std::get_if<gpt::GPTConfig>(&config)) return gpt2->n_embd;
  if (const auto* llama = std::get_if<LlamaConfig>(&config)) return llama->hidden_size;
  return std::get<OPTConfig>(config).word_embed_proj_dim;
}

std::string LmShape::describe() const {
  std::ostringstream line;
  if (const auto* g = std::get_if<gpt::GPTConfig>(&config)) {
    line << "GPT-2: " << g->n_layer << " layers, " << g->n_head << " heads, hidden " << g->n_embd;
  } else if (const auto* l = std::get_if<LlamaConfig>(&config)) {
    line << l->family() << ": " << l->num_hidden_layers << " layers, " << l->num_attention_heads << " heads ("
         << l->num_key_value_heads << " key-value) of " << l->head_dim << ", hidden " << l->hidden_size;
  } else {
    const OPTConfig& m = std::get<OPTConfig>(config);
    line << "OPT: " << m.num_hidden_layers << " layers, " << m.num_attention_heads << " heads, hidden " << m.hidden_size;
  }
  line << ", vocabulary " << vocab_size() << ", " << static_cast<double>(parameter_count()) / 1e6 << "M parameters";
  return line.str();
}

nn::CausalLMPtr LmShape::build(const parallel::ModelOptions& options) const {
  if (const auto* gpt2 = std::get_if<gpt::GPTConfig>(&config)) return gpt::GPT(*gpt2, options).ptr();
  if (const auto* llama = std::get_if<LlamaConfig>(&config)) return LlamaForCausalLM(*llama, options).ptr();
  return OPTForCausalLM(std::get<OPTConfig>(config), options).ptr();
}

LmShape read_lm_shape(const nlohmann::json& config, const std::string& where) {
  const std::string type = io::config_value<std::string>(config, "model_type", "", where);
  if (type == gpt::gpt_format().model_type) return gpt::gpt_format().read_config(config, where);
  if (is_llama_family(type)) return llama_format(type).read_config(config, where);
  return opt_format().read_config(config, where);  // names the model_type when it is not OPT's either
}

nlohmann::json write_lm_config(const LmShape& shape) {
  return with_format(shape, [](const auto& format, const auto& c) { return format.write_config(c); });
}

train::HfWeightNames lm_weight_names(const LmShape& shape) {
  return with_format(shape, [](const auto& format, const auto& c) { return format.names_for(c); });
}

LmShape shape_of(nn::CausalLM& model) {
  if (auto* gpt2 = dynamic_cast<gpt::GPTImpl*>(&model)) return gpt2->config;
  if (auto* o = dynamic_cast<OPTForCausalLMImpl*>(&model)) return o->config;
  if (auto* l = dynamic_cast<LlamaForCausalLMImpl*>(&model)) return l->config;
  fail("a causal language model of a family Kuafu cannot save: " + model.family());
}

nn::CausalLMPtr load_causal_lm(const std::string& dir, torch::Device device, torch::Dtype dtype) {
  return load_causal_lm(dir, train::Materialization::all_in(device, dtype));
}

std::function<nn::CausalLMPtr(parallel::ModelOptions)> described_lm(const LmShape& shape) {
  return [shape](parallel::ModelOptions options) {
    options.device = torch::kMeta;
    return shape.build(options);
  };
}

train::ModelRecipe<nn::CausalLMPtr> causal_lm_folder_recipe(const std::string& dir, const std::string& name) {
  train::ModelRecipe<nn::CausalLMPtr> recipe{name, /*trained=*/false};
  const LmShape shape = read_lm_shape(io::read_hf_config(dir), dir + "/config.json");
  recipe.describe = described_lm(shape);
  recipe.parameters = static_cast<double>(shape.parameter_count());
  // Every weight comes from the folder, so nothing is drawn, and no float32 copy of a model held in bf16
  // is ever made.
  recipe.draw = [dir](nn::CausalLMPtr& model) { load_lm_weights(*model, io::read_hf_folder(dir)); };
  return recipe;
}

nn::CausalLMPtr load_causal_lm(const std::string& dir, const train::Materialization& how) {
  return train::build_as(causal_lm_folder_recipe(dir), how);
}

void load_lm_weights(nn::CausalLM& model, const io::HfFolder& folder) {
  train::load_pretrained(model.module(), model.tp, folder, lm_weight_names(shape_of(model)));
}

void save_causal_lm(nn::CausalLM& model, const std::string& dir, const io::HfWriteOptions& options) {
  train::export_pretrained(model.module(), model.tp, dir, write_lm_config(shape_of(model)), options);
}

}  // namespace kuafu::opt

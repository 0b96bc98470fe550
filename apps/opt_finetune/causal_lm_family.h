// The causal language models kuafu-opt and kuafu-chat fine-tune, whichever family a Hugging Face
// folder holds: OPT (a folder, a published shape or the model.* keys), GPT-2 (a folder) and the Llama
// family (a Llama, Qwen2, Qwen3 or Mistral folder), told apart by config.json's model_type. Everything
// past here sees an nn::CausalLM.
#pragma once

#include <optional>
#include <string>
#include <variant>

#include "apps/gpt/model.h"
#include "apps/opt_finetune/model.h"
#include "apps/opt_finetune/model_llama.h"
#include "core/io/bpe_tokenizer.h"
#include "core/io/hf_folder.h"
#include "core/nn/causal_lm.h"
#include "core/train/hf_interop.h"
#include "core/train/lazy_model.h"
#include "core/train/model_recipe.h"

namespace kuafu::opt {

// A model's family and shape.
struct LmShape {
  LmShape() = default;
  LmShape(const OPTConfig& c) : config(c) {}        // NOLINT(google-explicit-constructor): a shape is either
  LmShape(const gpt::GPTConfig& c) : config(c) {}   // NOLINT(google-explicit-constructor)
  LmShape(const LlamaConfig& c) : config(c) {}      // NOLINT(google-explicit-constructor)

  std::variant<OPTConfig, gpt::GPTConfig, LlamaConfig> config;

  bool is_gpt2() const { return std::holds_alternative<gpt::GPTConfig>(config); }
  bool is_llama() const { return std::holds_alternative<LlamaConfig>(config); }
  std::string family() const;  // "OPT", "GPT-2", "Llama", "Qwen2", ...
  int64_t parameter_count() const;
  double flops_per_token(int64_t t) const;  // forward + backward
  int64_t vocab_size() const;
  int64_t positions() const;
  int64_t layers() const;
  int64_t final_width() const;  // what a head on the final hidden states reads
  // The ids that begin every example and end every response: GPT-2's and OPT's one token (BOS = EOS) by
  // name in `tokenizer`; for the Llama family the BOS the tokenizer puts before a text (as transformers'
  // tokenizer(text), so trl, frames it; none for Qwen's) and config.json's eos_token_id (the first of a
  // list). kuafu::Error, `where` naming the tokenizer, when the tokenizer lacks them.
  struct SpecialIds {
    std::optional<int64_t> bos;
    int64_t eos = 0;
  };
  SpecialIds special_ids(const io::BpeTokenizer& tokenizer, const std::string& where) const;
  // The folder's class name for a head on the trunk: "<family>ForSequenceClassification".
  std::string classifier_architecture() const;
  std::string describe() const;  // "OPT: 2 layers, 4 heads, hidden 64, vocabulary 512, 0.1M parameters"

  // The model, seeded by the caller, laid out by `options`.
  nn::CausalLMPtr build(const parallel::ModelOptions& options = {}) const;
};

// The shape of a model's config.json (`where` names it in errors): model_type "opt", "gpt2", "llama",
// "qwen2", "qwen3" or "mistral", checked as each family's format checks it; kuafu::Error naming `where`
// for another model_type.
LmShape read_lm_shape(const nlohmann::json& config, const std::string& where);
// The config.json of `shape`'s causal language model (OPTForCausalLM, GPT2LMHeadModel).
nlohmann::json write_lm_config(const LmShape& shape);
// How the family's folders name the model's tensors.
train::HfWeightNames lm_weight_names(const LmShape& shape);
// A recipe's describe for `shape`'s model (OPT or GPT-2) on the meta device.
std::function<nn::CausalLMPtr(parallel::ModelOptions)> described_lm(const LmShape& shape);
// The shape `model` was built with.
LmShape shape_of(nn::CausalLM& model);

// The causal language model `dir` holds (OPTForCausalLM, GPT2LMHeadModel), every weight read from it
// (nothing drawn): a frozen model of a run (`name`: its section models.<name>), or one to chat with.
train::ModelRecipe<nn::CausalLMPtr> causal_lm_folder_recipe(const std::string& dir, const std::string& name = "");
// That model whole on `device`, its weights held in `dtype` (a frozen model's compute dtype: made in it,
// never in float32 first).
nn::CausalLMPtr load_causal_lm(const std::string& dir, torch::Device device = torch::kCPU,
                               torch::Dtype dtype = torch::kFloat32);
// The same, its parameters made as `how` says (a frozen model's: FrozenModel::materialization_of).
nn::CausalLMPtr load_causal_lm(const std::string& dir, const train::Materialization& how);
// `folder`'s weights into `model` (built from its config), on any tensor-parallel layout.
void load_lm_weights(nn::CausalLM& model, const io::HfFolder& folder);
// Writes `model` (serial) as a new folder `dir` that transformers' AutoModelForCausalLM loads.
void save_causal_lm(nn::CausalLM& model, const std::string& dir, const io::HfWriteOptions& options = {});

}  // namespace kuafu::opt

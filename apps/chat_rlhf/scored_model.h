// RLHF's reward and value models: a causal language model's trunk (OPT or GPT-2) with a scalar head on
// its final hidden states, Hugging Face's OPTForSequenceClassification / GPT2ForSequenceClassification
// with one label (the trunk's names, "model.decoder.*" or "transformer.*", and "score.weight",
// [1, final width], no bias). The reward model reads it at each response's last real token; the value
// model (PPO's critic) at every position.
#pragma once

#include "apps/opt_finetune/causal_lm_family.h"

namespace kuafu::chat {

struct ScoredModelImpl : torch::nn::Module, hooks::SiteModel {
  // A fresh trunk of `shape` (seeded by the caller) with a head.
  explicit ScoredModelImpl(const opt::LmShape& shape, parallel::ModelOptions options = {});
  // A head on `trunk`, shared with it (PPO's actor and critic on one trunk): this module's parameters
  // are the trunk's and the head's, the head made on `device` (the meta device: described, nothing
  // drawn; the trunk's frozen weights may be in host memory). `reads_logits`: its tail part holds the
  // trunk's output layer too, for values_and_logits.
  ScoredModelImpl(nn::CausalLMPtr trunk, const torch::Device& device, bool reads_logits = false);
  // The trunk's initialisation and the head's N(0, 0.02) (Hugging Face's initializer range), from the
  // current seed, in the order an eager model draws them: for a model described on the meta device and
  // then materialised, or (with a WeightSink in scope) left described for a sharded strategy.
  void initialize();

  // Its sites: the trunk's head part and blocks, and a tail holding the final norm (and projection) and
  // the score head, so that Gemini and frozen-weight offload reach every parameter.
  torch::nn::Module& module() override { return *this; }
  hooks::BlockSites& block_sites() override { return sites_; }

  // The head at every position [B, T] of whole rows (tokens [B, T], real [B, T]: padding anywhere).
  torch::Tensor values(const torch::Tensor& tokens, const torch::Tensor& real);
  // The head at each row's last real token [B] (Hugging Face pools the rightmost non-pad token).
  torch::Tensor scores(const torch::Tensor& tokens, const torch::Tensor& real);
  // A shared trunk's one pass: the head at every position [B, T] and the trunk's whole next-token
  // logits [B, T, V] (built with reads_logits).
  struct ValuesAndLogits {
    torch::Tensor values, logits;
  };
  ValuesAndLogits values_and_logits(const torch::Tensor& tokens, const torch::Tensor& real);

  opt::LmShape shape;       // the trunk's
  nn::CausalLMPtr lm;       // the trunk: its children are this module's (its tied output layer unused)
  // The trunk's top-level modules left out of this one: an untied output layer where the logits are not
  // read (Llama's lm_head), which a causal folder starting this model holds and this model does not.
  std::vector<std::string> left_out;
  parallel::SerialLinear score{nullptr};  // [1, final width], no bias
  parallel::TensorParallel tp;  // the trunk's

 private:
  // The rows through the trunk's sites, `tail` reading the final stream in the score tail part.
  torch::Tensor through_sites(const torch::Tensor& tokens, const torch::Tensor& real,
                              const std::function<torch::Tensor(const torch::Tensor&)>& tail);
  torch::Tensor head_values(const torch::Tensor& x);  // final stream [B, T, H] -> [B, T]

  bool reads_logits_ = false;
  hooks::BlockSites sites_;
};
TORCH_MODULE(ScoredModel);

// Index [B] of each row's rightmost real token.
torch::Tensor last_real_token(const torch::Tensor& real);

// The trunk's shape of a sequence-classification folder's config.json (OPT or GPT-2; `where` names
// it), refusing num_labels ≠ 1 by name.
opt::LmShape read_scored_shape(const nlohmann::json& config, const std::string& where);
// The sequence-classification model `dir` holds, every weight (the head's too) read from it: a frozen
// model of a run (`name`: its section models.<name>), or a critic's start.
train::ModelRecipe<ScoredModel> scored_folder_recipe(const std::string& dir, const std::string& name = "");
// That model whole on `device`, its weights held in `dtype`.
ScoredModel load_scored_model(const std::string& dir, torch::Device device = torch::kCPU,
                              torch::Dtype dtype = torch::kFloat32);
// The same, its parameters made as `how` says (a frozen model's: FrozenModel::materialization_of).
ScoredModel load_scored_model(const std::string& dir, const train::Materialization& how);
// Writes `model` (serial) as a new folder that transformers' AutoModelForSequenceClassification loads.
// A GPT-2 folder has no pad_token_id (GPT-2 has no pad token): transformers then scores the last token
// of a batch of one, so score padded rows one at a time there.
void save_scored_model(ScoredModel& model, const std::string& dir, const io::HfWriteOptions& options = {});
// Loads `dir` into `model`: a sequence-classification folder whole, or a causal language model's trunk
// (an SFT model: the head keeps its initial values). True when the folder held the head; kuafu::Error
// naming the folder otherwise.
bool load_scored_weights(ScoredModel& model, const std::string& dir);

}  // namespace kuafu::chat

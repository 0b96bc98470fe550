// RLHF's reward and value models: an OPT decoder with a scalar head on its final hidden states,
// Hugging Face's OPTForSequenceClassification with one label ("model.decoder.*" + "score.weight",
// [1, word_embed_proj_dim], no bias). The reward model reads it at each response's last real token; the
// value model (PPO's critic) at every position.
#pragma once

#include "apps/opt_finetune/model.h"
#include "core/train/hf_model_format.h"

namespace kuafu::chat {

struct ScoredModelImpl : torch::nn::Module, hooks::SiteModel {
  explicit ScoredModelImpl(const opt::OPTConfig& config, parallel::ModelOptions options = {});
  // A head on `trunk`'s decoder, shared with it (PPO's actor and critic on one trunk): this module's
  // parameters are the trunk's and the head's.
  explicit ScoredModelImpl(opt::OPTForCausalLM trunk);

  // Its sites: the decoder's head part and blocks, and a tail holding the final norm, projection and
  // score head, so that Gemini and frozen-weight offload reach every parameter.
  torch::nn::Module& module() override { return *this; }
  hooks::BlockSites& block_sites() override { return sites_; }

  // The head at every position [B, T] of whole rows (tokens [B, T], real [B, T]: padding anywhere).
  torch::Tensor values(const torch::Tensor& tokens, const torch::Tensor& real);
  // The head at each row's last real token [B] (Hugging Face pools the rightmost non-pad token).
  torch::Tensor scores(const torch::Tensor& tokens, const torch::Tensor& real);

  opt::OPTConfig config;
  parallel::TensorParallel tp;
  opt::OPTForCausalLM lm;  // the decoder: its "model" is this module's "model" (its tied output layer unused)
  torch::nn::Linear score{nullptr};

 private:
  void add_score_head(const torch::Device& device);
  hooks::BlockSites sites_;
};
TORCH_MODULE(ScoredModel);

// Index [B] of each row's rightmost real token.
torch::Tensor last_real_token(const torch::Tensor& real);

using ScoredFormat = train::HfModelFormat<ScoredModel, opt::OPTConfig>;
// OPTForSequenceClassification folders with one label: read (refusing num_labels ≠ 1 by name) and written.
const ScoredFormat& scored_format();
// Loads `dir` into `model`: a sequence-classification folder whole, or a causal language model's decoder
// (an SFT model: the head keeps its initial values). True when the folder held the head; kuafu::Error
// naming the folder otherwise.
bool load_scored_weights(ScoredModel& model, const std::string& dir);

}  // namespace kuafu::chat

// The DPO stage (kuafu-chat dpo): the policy trained directly on preference pairs against a frozen
// reference (the SFT model), whose log-probabilities are computed once per pair and cached. Evaluated by
// held-out preference accuracy (the implicit reward β·h ranks the chosen answer first) and mean margin.
#pragma once

#include <memory>

#include "apps/chat_rlhf/stage_config.h"
#include "apps/chat_rlhf/stage_inputs.h"
#include "apps/chat_rlhf/pair_task.h"
#include "core/train/app.h"
#include "core/train/parallelize.h"

namespace kuafu::chat {

class DpoTask : public PairTask {
 public:
  DpoTask(nn::CausalLMPtr policy, nn::CausalLMPtr reference, std::shared_ptr<const PreferenceSet> train,
          std::shared_ptr<const PreferenceSet> val, const train::TrainSettings& settings, const DpoSettings& dpo,
          int64_t pad_id, const torch::Device& device);

  torch::nn::Module& model() override { return policy_->module(); }
  // The policy's blocks take the memory strategy's hooks (Gemini's gathers).
  bool set_block_hooks(hooks::BlockHooks* hooks) override {
    policy_->set_block_hooks(hooks);
    return true;
  }
  // The reference, a frozen model of its own section ([models.reference]: its dtype, memory.offload_frozen).
  std::vector<train::RunModel> frozen_models() override;
  torch::Tensor loss(int64_t step, int64_t first_row, int64_t rows) override;
  // Loss sum, pairs, pairs ranked right by the implicit reward; extra: the margin (β·h) sum, the chosen
  // answers' log-prob sum, pairs whose chosen answer the policy finds likelier.
  train::LossSum evaluate(int rank, int ranks) override;
  std::vector<train::EvalMetric> eval_metrics(const train::LossSum& sums) const override;
  std::vector<std::string> checkpoint_keys() const override { return {"model.", "lora.", "data.train", "dpo."}; }

 private:
  // The policy's and the (cached) reference's log-prob sums of the pairs' answers: [2n] each.
  std::pair<torch::Tensor, torch::Tensor> logprob_sums(const PairRows& batch, const PreferenceSet& set,
                                                       std::vector<torch::Tensor>& cache);

  // Each pair's loss [n] from the log-prob sums [2n] of `batch` (IPO per token: over its learned tokens).
  torch::Tensor pair_losses(const torch::Tensor& policy, const torch::Tensor& reference, const PairRows& batch) const;

  nn::CausalLMPtr policy_, reference_;
  std::vector<torch::Tensor> train_cache_, val_cache_;  // per pair: the reference's [chosen, rejected], once computed
  DpoSettings dpo_;
};

std::unique_ptr<train::App> make_dpo_app(const config::Config& config);

}  // namespace kuafu::chat

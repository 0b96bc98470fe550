// The reward model stage (kuafu-chat rm): an OPT decoder with a scalar head, started from the SFT
// model, trained on preference pairs with the pairwise loss −log σ(r_chosen − r_rejected − margin), and
// evaluated by held-out pairwise accuracy (overall and per kind of rejected answer) and mean margin.
#pragma once

#include <memory>

#include "apps/chat_rlhf/scored_model.h"
#include "apps/chat_rlhf/stage_config.h"
#include "apps/chat_rlhf/stage_inputs.h"
#include "apps/chat_rlhf/pair_task.h"
#include "core/train/app.h"

namespace kuafu::chat {

class RewardTask : public PairTask {
 public:
  RewardTask(ScoredModel model, std::shared_ptr<const PreferenceSet> train, std::shared_ptr<const PreferenceSet> val,
             const train::TrainSettings& settings, double margin, int64_t pad_id, const torch::Device& device);

  torch::nn::Module& model() override { return *model_; }
  // Its block sites (the score head in the tail): Gemini applies.
  bool set_block_hooks(hooks::BlockHooks* hooks) override {
    model_->set_block_hooks(hooks);
    return true;
  }
  // The mean pairwise loss of this rank's pairs of the step.
  torch::Tensor loss(int64_t step, int64_t first_row, int64_t rows) override;
  // Loss sum, pairs, pairs ranked right; extra: the margin sum, then per kind of val's pairs ranked right, then their counts.
  train::LossSum evaluate(int rank, int ranks) override;
  std::vector<train::EvalMetric> eval_metrics(const train::LossSum& sums) const override;
  std::vector<std::string> checkpoint_keys() const override { return {"model.", "data.train", "rm.margin"}; }

 private:
  ScoredModel model_;
  double margin_;
};

std::unique_ptr<train::App> make_reward_app(const config::Config& config);

}  // namespace kuafu::chat

// Online RL from the reward model (kuafu-chat ppo / grpo), InstructGPT's third stage. Every
// rl.epochs × rl.mini_batches optimizer steps the actor samples a rollout (batched KV-cache generation
// under the run's layout, dropout off), which the four models turn into experience; each step then
// updates on one mini-batch of it. Each data rank samples and keeps its own share of the rollout (its
// prompts, and under GRPO their whole groups), so experience never crosses ranks; whitening, group
// statistics and the token counts that normalise a mini-batch's loss are taken over all ranks.
//   PPO: actor and critic trained, per-token KL to the reference in the reward, GAE, clipped policy and
//        value losses, optional entropy bonus and pre-training (ptx) loss.
//   GRPO: the actor alone; rl.group_size samples per prompt, group-normalised advantages, KL in the loss
//        (or in the reward), token-mean / sequence-mean / Dr. GRPO aggregation.
// Logged every step: the rollout's mean reward, KL per sequence, response length, EOS rate and the
// word-overlap F1 of the responses with the prompts' reference answers, a score the reward model
// never saw; PPO's clip fraction, approximate KL and ratio.
#pragma once

#include <memory>
#include <optional>

#include "apps/chat_rlhf/experience.h"
#include "apps/chat_rlhf/stage_config.h"
#include "apps/chat_rlhf/stage_inputs.h"
#include "core/io/epoch_order.h"
#include "core/io/instruction_batches.h"
#include "core/train/app.h"
#include "core/train/parallelize.h"
#include "core/util/weight_sink.h"

namespace kuafu::chat {

// Word-level F1 of an answer against a reference (lower-cased words, counted with repeats); 0 when
// either has no word.
double answer_f1(const std::string& answer, const std::string& reference);

struct RlModels {
  torch::Device device = torch::kCPU;  // where they compute
  nn::CausalLMPtr actor, reference;
  std::optional<ScoredModel> critic;  // PPO; under rl.shared_trunk a value head on the actor's decoder
  bool shared_trunk = false;          // then the critic is trained as the actor (one model, one loss)
  ScoredModel reward{nullptr};  // empty: rl.rewards alone
  // The trained models' weights when left described for their sharded strategies (ZeRO, Gemini) to
  // fill; empty where materialised. Under rl.shared_trunk the actor's include the value head's.
  DeferredWeights actor_weights, critic_weights;
};

class RlTask : public train::RunTask {
 public:
  RlTask(Stage stage, RlModels models, RlSettings settings, ChatText text, std::vector<Prompt> prompts,
         std::vector<Prompt> eval_prompts, const train::TrainSettings& train, dist::GroupPtr data,
         std::shared_ptr<io::InstructionBatcher> ptx);

  std::vector<train::RunModel> models() override;
  std::map<std::string, torch::Tensor> losses(int64_t step, int64_t first_row, int64_t rows) override;
  // The actor during the critic's warm-up rollouts (rl.critic_warmup_rollouts).
  bool sits_out(const std::string& name, int64_t step) const override;
  // With rl.ptx_coef > 0 the pre-training term is a second backward pass of the actor alone (a pass of its
  // own, so that a memory strategy gathering each part once per backward, Gemini, manages it too).
  int backward_passes() const override { return ptx_ && settings_.ptx_coef > 0 ? 2 : 1; }
  std::map<std::string, torch::Tensor> further_losses(int pass, int64_t step, int64_t first_row, int64_t rows) override;
  // Greedy answers to this rank's share of the held-out prompts: loss sum = −(score − β·KL) summed,
  // count = prompts, correct = answers ended by EOS; extra: score, KL, length and F1 sums.
  train::LossSum evaluate(int rank, int ranks) override;
  std::vector<train::EvalMetric> eval_metrics(const train::LossSum& sums) const override;
  double flops_per_item() const override;
  int64_t items_per_row() const override;
  std::vector<std::string> checkpoint_keys() const override { return {"model.", "lora.", "rl.", "data.train"}; }
  std::map<std::string, double> step_figures(int64_t step) override;
  // The rollout being trained on (this rank's experience, the epochs' orders, the mini-batches' counts and
  // the rollout's figures) and the adaptive KL coefficient: a run resumed between a rollout's steps trains
  // on the rollout the earlier weights sampled, as the uninterrupted run does.
  io::NamedTensors task_state() const override;
  void restore_task_state(const io::NamedTensors& state) override;

  const RlModels& held() const { return models_; }
  const Experience& experience() const { return experience_; }  // the latest rollout's (this rank's share)

 private:
  // Samples rollout `rollout`'s share of this rank and makes its experience.
  void make_rollout(int64_t rollout);
  // Responses to `prompts` from the actor (eval mode): sampled with `sampling`, or greedy.
  std::vector<std::vector<int64_t>> sample(const std::vector<std::vector<int64_t>>& prompts, nn::SamplingOptions sampling);
  // Each response's text (its EOS dropped).
  std::vector<std::string> answers_of(const std::vector<std::vector<int64_t>>& responses) const;
  // The rewards a program checks (rl.rewards) of each response (its tokens and text) to its prompt; empty
  // without any.
  std::vector<double> verifiable_scores(const std::vector<std::vector<int64_t>>& responses, const std::vector<std::string>& answers,
                                        const std::vector<const Prompt*>& prompts) const;
  // Those scores [B] on the device, as the experience takes them; undefined when empty.
  torch::Tensor on_device(const std::vector<double>& scores) const;
  // This rank's share of a rollout's samples, one row per sample (GRPO: groups of rl.group_size rows).
  struct Samples {
    std::vector<std::vector<int64_t>> prompts, responses;
    std::vector<const Prompt*> sources;
    std::vector<std::string> answers;  // each response's text, decoded once
    std::vector<double> program;       // rl.rewards' score of each row; empty without them
    int64_t groups_with_spread = 0, rounds = 1;  // dynamic sampling's figures
    // Rows [first, first + count) of `other` appended.
    void append(const Samples& other, size_t first, size_t count);
  };
  // Rollout `rollout`'s samples; with rl.sampling_rounds > 1 (DAPO's dynamic sampling) groups whose
  // program rewards are all equal give way to groups of further prompts, round after round.
  Samples draw_samples(int64_t rollout);
  // True when the rollout's only update scores the policy for the ratio (GRPO, one epoch of one
  // mini-batch, KL not in the reward): the experience skips the policy's pass, as trl does.
  bool update_scores_policy() const;
  // GRPO: the rollout's advantages from its scores (and KL when in the reward), per sequence [B].
  torch::Tensor grpo_advantages(const Experience& e) const;

  Stage stage_;
  RlModels models_;
  std::unique_ptr<train::ParallelModel> actor_sites_;
  RlSettings settings_;
  ChatText text_;
  std::vector<Prompt> prompts_, eval_prompts_;
  io::EpochOrder prompt_order_;
  std::shared_ptr<io::InstructionBatcher> ptx_;
  dist::GroupPtr data_;
  uint64_t seed_;
  int64_t batch_size_;  // rows per optimizer step (all ranks)
  torch::Device device_;
  KlController kl_;
  RunningMoments score_moments_;  // every rollout's scores so far (rl.score_scaling), saved with the run

  int64_t rollout_ = -1;  // the rollout experience_ holds
  Experience experience_;
  std::vector<std::vector<int64_t>> epoch_orders_;  // per epoch: the order of this rank's rows
  std::vector<BatchCounts> mini_batch_counts_;      // per (epoch, mini-batch): over all ranks
  std::map<std::string, double> rollout_figures_;   // over all ranks
  // Seconds this rank spent on the rollout made in this step (sampling, then scoring it as experience),
  // reported with that step only: where a PPO / GRPO iteration goes besides the updates.
  std::map<std::string, double> rollout_seconds_;
  torch::Tensor step_sums_;  // this step's [clipped, approx KL, ratio, tokens, value loss, k1] sums, this rank
};

std::unique_ptr<train::App> make_rl_app(const config::Config& config, Stage stage);

}  // namespace kuafu::chat

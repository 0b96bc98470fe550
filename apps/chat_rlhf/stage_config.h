// The configs of kuafu-chat's stages. Every stage is an OPT run (apps/opt_finetune's keys: model.*,
// data.tokenizer / train / val / context, train.*, optim.*, lora.*, generate.*), plus its own section:
// rm.* (the reward model), dpo.*, and rl.* for PPO and GRPO, whose four models each take their own
// optim / precision / memory from models.<actor|critic|reference|reward>.*.
#pragma once

#include <string>

#include "apps/chat_rlhf/advantages.h"
#include "apps/chat_rlhf/experience.h"
#include "apps/chat_rlhf/policy_losses.h"
#include "apps/chat_rlhf/preference_losses.h"
#include "apps/chat_rlhf/verifiable_rewards.h"
#include "apps/opt_finetune/task.h"
#include "core/config/config.h"
#include "core/train/runtime.h"

namespace kuafu::chat {

enum class Stage { Sft, Reward, Dpo, Ppo, Grpo };
const char* stage_name(Stage stage);  // "sft", "rm", "dpo", "ppo", "grpo"

config::Schema stage_schema(Stage stage);

// The stages train data parallel (any memory strategy the models allow), not under pipeline, sequence or
// tensor parallelism: kuafu::Error naming the keys otherwise (no check without a runtime).
void require_data_parallel(const config::Config& config, const train::Runtime* runtime, const parallel::ModelOptions& options,
                           Stage stage);

// rm.*
struct RewardSettings {
  double margin = 0;
};
RewardSettings reward_settings(const config::Config& config);

// dpo.*
struct DpoSettings {
  double beta = 0.1;
  PreferenceLoss loss = PreferenceLoss::Sigmoid;
  std::string reference;  // the frozen reference's folder; "" = model.init_from (the SFT model)
  bool ipo_per_token = true;   // IPO on per-token means of the log-probability ratios (trl); false: the sums
  bool disable_dropout = true; // the policy trains without dropout (trl's default), so its ratio to the reference is exact
};
DpoSettings dpo_settings(const config::Config& config);

// rl.*: PPO's and GRPO's rollouts and updates.
struct RlSettings {
  std::string reward_model;   // rl.reward_model: a kuafu-chat rm export; empty: rl.rewards alone
  std::string critic_init;    // rl.critic_init: the critic's start ("" = the reward model)
  bool shared_trunk = false;  // rl.shared_trunk: the critic is a value head on the actor's decoder
  std::string reference;      // rl.reference: "" = model.init_from
  ExperienceSettings experience;  // sampling from generate.*, KL, penalty, GAE, whitening
  double kl_target = 0, kl_horizon = 10000;  // adaptive KL (target 0: fixed)
  int64_t prompts_per_rollout = 8;  // rl.prompts_per_rollout (GRPO: each sampled group_size times)
  int64_t epochs = 1, mini_batches = 1;  // PPO epochs over the rollout, mini-batches (optimizer steps) per epoch
  double clip = 0.2, value_clip = 0.2, value_coef = 0.1, entropy_coef = 0, ptx_coef = 0;
  double clip_high = 0.2;  // the ratio's upper clip range (rl.clip_high; rl.clip unless set)
  bool scale_scores = false;  // PPO: scores divided by their running std (rl.score_scaling)
  int64_t critic_warmup_rollouts = 0;  // PPO: the first rollouts train the critic alone
  Aggregation aggregation = Aggregation::TokenMean;
  // GRPO
  int64_t group_size = 4;
  RewardScaling scale_rewards = RewardScaling::Group;
  bool kl_in_reward = false;  // GRPO: k1 in the reward (the exact KL-regularised optimum) instead of k3 in the loss
  ImportanceLevel importance_level = ImportanceLevel::Token;  // GRPO: per token, or per sequence (GSPO)
  int64_t sampling_rounds = 1;  // GRPO: > 1 is DAPO's dynamic sampling (groups without spread dropped)
  VerifiableRewards verifiable;  // rewards a program checks (rl.rewards), summed with the reward model's score
  std::string eval_prompts;   // held-out prompts (data.val)
  int64_t eval_prompts_count = 16;
  // Optimizer steps per rollout.
  int64_t steps_per_rollout() const { return epochs * mini_batches; }
};
RlSettings rl_settings(const config::Config& config, Stage stage);
// kuafu::Error at rl.reward_model when a run has nothing to score its samples: no reward model, no rl.rewards
// (checked when a run starts; a config may leave both to be given later, as the benchmark needs neither).
void require_rewards(const config::Config& config, const RlSettings& settings);

}  // namespace kuafu::chat

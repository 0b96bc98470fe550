#include "apps/chat_rlhf/stage_config.h"

#include "apps/opt_finetune/app_config.h"
#include "core/train/generate_settings.h"
#include "core/train/parallelize.h"
#include "core/train/trainer.h"

namespace kuafu::chat {

const char* stage_name(Stage stage) {
  switch (stage) {
    case Stage::Sft: return "sft";
    case Stage::Reward: return "rm";
    case Stage::Dpo: return "dpo";
    case Stage::Ppo: return "ppo";
    case Stage::Grpo: return "grpo";
  }
  return "";
}

namespace {

void add_rl_schema(config::Schema& s, Stage stage) {
  s.add_string("rl.reward_model", "", "the reward model's folder (kuafu-chat rm export); empty: rl.rewards alone");
  add_verifiable_reward_keys(s);
  s.add_string("rl.reference", "", "the frozen reference policy's folder; empty: model.init_from");
  s.add_string("rl.kl_estimator", stage == Stage::Ppo ? "k1" : "k3",
               "per-token KL estimator: k1, k2 or k3 (PPO: in the reward; GRPO: in the loss)")
      .choices({"k1", "k2", "k3"});
  s.add_float("rl.kl_coef", stage == Stage::Ppo ? 0.05 : 0.04, "KL coefficient (β)").min(0);
  s.add_float("rl.missing_eos_penalty", 0.0, "added to the score of a response cut at generate.max_new_tokens");
  s.add_int("rl.prompts_per_rollout", 8, "prompts sampled per rollout (on every data rank together)").min(1);
  s.add_int("rl.epochs", 1, "passes over each rollout's experience").min(1).max(100);
  s.add_int("rl.mini_batches", 1, "optimizer steps per pass (train.batch_size = the rollout's rows / this)").min(1);
  s.add_float("rl.clip", 0.2, "the policy ratio's clip range ε: [1 - ε, 1 + ε]").min(0).max(10);
  s.add_float("rl.clip_high", 0.2, "the upper clip range when set (DAPO's clip-higher, trl's epsilon_high): "
              "[1 - rl.clip, 1 + rl.clip_high]; unset: rl.clip").min(0).max(10);
  s.add_float("rl.entropy_coef", 0.0, "entropy bonus").min(0);
  s.add_string("rl.eval_prompts", "data/instructions/out/val.jsonl", "held-out prompts (JSONL with \"prompt\")");
  s.add_int("rl.eval_prompts_count", 16, "held-out prompts answered at each evaluation").min(1);
  if (stage == Stage::Ppo) {
    s.add_string("rl.critic_init", "", "the critic's starting folder; empty: the reward model");
    s.add_bool("rl.shared_trunk", false,
               "the critic is a value head on the actor's decoder (one model trained on the policy loss plus "
               "rl.value_coef x the value loss; models.critic unused) instead of a model of its own");
    s.add_float("rl.kl_target", 0.0, "adaptive KL: the KL per sequence to hold (0: a fixed rl.kl_coef)").min(0);
    s.add_float("rl.kl_horizon", 10000, "adaptive KL: its horizon in samples").min(1);
    s.add_float("rl.gamma", 1.0, "GAE discount γ").min(0).max(1);
    s.add_float("rl.lambda", 0.95, "GAE λ").min(0).max(1);
    s.add_string("rl.score_scaling", "none",
                 "the reward model's scores before they become rewards: none, std (divided by the running std of "
                 "every score so far) or mean-std (less the running mean first); trl's use_score_scaling/_norm")
        .choices({"none", "std", "mean-std"});
    s.add_float("rl.score_clip", 0.0, "clip the (scaled) scores to ±this before they become rewards (0: no clip)").min(0);
    s.add_int("rl.critic_warmup_rollouts", 0,
              "rollouts whose steps train the critic alone, the actor unchanged (OpenRLHF's freezing_actor_steps)").min(0);
    s.add_bool("rl.bootstrap_truncated", false,
               "a response cut at generate.max_new_tokens bootstraps the critic's value after its last token; "
               "false: the cut ends its episode (the reward model scored the cut text; see rl.missing_eos_penalty)");
    s.add_bool("rl.whiten_advantages", true, "whiten advantages over the rollout (all data ranks)");
    s.add_float("rl.value_clip", 0.2, "the value loss's clip range").min(0);
    s.add_float("rl.value_coef", 0.1, "the value loss's weight in the critic's loss").min(0);
    s.add_float("rl.ptx_coef", 0.0, "weight of the pre-training (SFT) loss on data.train").min(0);
    s.add_bool("benchmark.generate_without_cache", true,
               "kuafu-chat benchmark: also time the rollout's tokens recomputing every row at each step (slow)");
  } else {
    s.add_int("rl.group_size", 4, "samples per prompt (G)").min(2).max(1024);
    s.add_string("rl.scale_rewards", "group", "advantage scaling: group, batch or none").choices({"group", "batch", "none"});
    s.add_string("rl.loss_aggregation", "sequence-mean", "token-mean, sequence-mean or constant (Dr. GRPO)")
        .choices({"token-mean", "sequence-mean", "constant"});
    s.add_string("rl.importance_sampling", "token",
                 "the policy ratio per token (GRPO, DAPO) or per sequence: the mean log-ratio over the response's "
                 "tokens (GSPO; with rl.loss_aggregation = \"sequence-mean\" as the paper)")
        .choices({"token", "sequence"});
    s.add_int("rl.sampling_rounds", 1,
              "DAPO's dynamic sampling when > 1: a group whose rewards from rl.rewards are all equal (no advantage "
              "to learn from) is dropped and the next prompts are drawn, up to this many rounds of "
              "rl.prompts_per_rollout prompts per rollout; a rollout still short keeps dropped groups")
        .min(1)
        .max(64);
    s.add_bool("rl.kl_in_reward", false,
               "k1 in each sample's reward instead of rl.kl_estimator in the loss (the penalty in the loss "
               "regularises towards KL(π_ref ‖ π), another optimum)");
  }
}

}  // namespace

config::Schema stage_schema(Stage stage) {
  config::Schema s = opt::opt_schema();
  switch (stage) {
    case Stage::Sft:
      break;
    case Stage::Reward:
      s.add_float("rm.margin", 0.0, "margin in the pairwise loss −log σ(r_chosen − r_rejected − margin)").min(0);
      break;
    case Stage::Dpo:
      s.add_float("dpo.beta", 0.1, "β: the strength of the KL regularisation towards the reference").min(1e-6);
      s.add_string("dpo.loss", "sigmoid", "sigmoid (DPO) or ipo").choices({"sigmoid", "ipo"});
      s.add_string("dpo.reference", "", "the frozen reference's folder; empty: model.init_from");
      s.add_bool("dpo.ipo_per_token", true, "IPO on the log-probability ratios averaged over each completion's tokens "
                 "(trl); false: summed over them (the IPO paper's sequence log-probabilities)");
      s.add_bool("dpo.disable_dropout", true, "train the policy with every dropout off (trl's default)");
      train::add_model_sections(s, {"reference"});
      break;
    case Stage::Ppo:
    case Stage::Grpo:
      add_rl_schema(s, stage);
      train::add_model_sections(s, stage == Stage::Ppo ? std::vector<std::string>{"actor", "critic", "reference", "reward"}
                                                       : std::vector<std::string>{"actor", "reference", "reward"});
      break;
  }
  return s;
}

void require_data_parallel(const config::Config& config, const train::Runtime* runtime, const parallel::ModelOptions& options,
                           Stage stage) {
  train::require_data_parallel(config, runtime, options, std::string("kuafu-chat ") + stage_name(stage));
}

RewardSettings reward_settings(const config::Config& config) { return {config.get_float("rm.margin")}; }

DpoSettings dpo_settings(const config::Config& config) {
  return {config.get_float("dpo.beta"), preference_loss_named(config.get_string("dpo.loss")), config.get_string("dpo.reference"),
          config.get_bool("dpo.ipo_per_token"), config.get_bool("dpo.disable_dropout")};
}

void require_rewards(const config::Config& config, const RlSettings& s) {
  if (s.reward_model.empty() && s.verifiable.empty()) {
    config.fail_at("rl.reward_model", "is empty and rl.rewards names no term: give a reward model's folder, rewards a program "
                                      "checks, or both");
  }
}

RlSettings rl_settings(const config::Config& config, Stage stage) {
  RlSettings s;
  const bool ppo = stage == Stage::Ppo;
  s.reward_model = config.get_string("rl.reward_model");
  s.reference = config.get_string("rl.reference");
  ExperienceSettings& e = s.experience;
  e.sampling = train::generate_settings(config).sampling;
  // Rollouts answer within the context: a prompt needs at least one position before the answer's.
  if (const int64_t context = config.get_int("data.context"); e.sampling.max_new_tokens >= context) {
    config.fail_at("generate.max_new_tokens", "(" + std::to_string(e.sampling.max_new_tokens) +
                                                  ") leaves no room for a prompt within data.context (" + std::to_string(context) + ")");
  }
  if (e.sampling.temperature <= 0) config.fail_at("generate.temperature", "must be > 0 for rollouts: the policy gradient needs sampled responses");
  e.kl_estimator = kl_estimator_named(config.get_string("rl.kl_estimator"));
  e.kl_coef = config.get_float("rl.kl_coef");
  e.missing_eos_penalty = config.get_float("rl.missing_eos_penalty");
  s.prompts_per_rollout = config.get_int("rl.prompts_per_rollout");
  s.epochs = config.get_int("rl.epochs");
  s.mini_batches = config.get_int("rl.mini_batches");
  s.clip = config.get_float("rl.clip");
  // A clip range of 0 makes every ratio's gradient vanish outside exact equality: nothing would learn.
  if (s.clip <= 0) config.fail_at("rl.clip", "must be > 0: the policy ratio is clipped to [1 - clip, 1 + clip]");
  s.clip_high = config.is_set("rl.clip_high") ? config.get_float("rl.clip_high") : s.clip;
  if (s.clip_high <= 0) config.fail_at("rl.clip_high", "must be > 0: the policy ratio is clipped to [1 - clip, 1 + clip_high]");
  s.entropy_coef = config.get_float("rl.entropy_coef");
  s.eval_prompts = config.get_string("rl.eval_prompts");
  s.eval_prompts_count = config.get_int("rl.eval_prompts_count");
  s.aggregation = Aggregation::TokenMean;
  if (ppo) {
    s.critic_init = config.get_string("rl.critic_init");
    s.shared_trunk = config.get_bool("rl.shared_trunk");
    if (s.shared_trunk && !s.critic_init.empty()) {
      config.fail_at("rl.critic_init", "names a critic folder, but rl.shared_trunk puts the value head on the actor's decoder");
    }
    s.kl_target = config.get_float("rl.kl_target");
    s.kl_horizon = config.get_float("rl.kl_horizon");
    e.gamma = config.get_float("rl.gamma");
    e.lambda = config.get_float("rl.lambda");
    e.whiten_advantages = config.get_bool("rl.whiten_advantages");
    e.bootstrap_truncated = config.get_bool("rl.bootstrap_truncated");
    s.critic_warmup_rollouts = config.get_int("rl.critic_warmup_rollouts");
    if (s.critic_warmup_rollouts > 0 && s.shared_trunk) {
      config.fail_at("rl.critic_warmup_rollouts", "needs a critic of its own: with rl.shared_trunk the value head trains on the actor's decoder");
    }
    s.scale_scores = config.get_string("rl.score_scaling") != "none";
    e.score_subtract_mean = config.get_string("rl.score_scaling") == "mean-std";
    e.score_clip = config.get_float("rl.score_clip");
    s.value_clip = config.get_float("rl.value_clip");
    s.value_coef = config.get_float("rl.value_coef");
    s.ptx_coef = config.get_float("rl.ptx_coef");
  } else {
    s.group_size = config.get_int("rl.group_size");
    s.scale_rewards = reward_scaling_named(config.get_string("rl.scale_rewards"));
    s.aggregation = aggregation_named(config.get_string("rl.loss_aggregation"));
    s.kl_in_reward = config.get_bool("rl.kl_in_reward");
    s.importance_level = importance_level_named(config.get_string("rl.importance_sampling"));
    s.sampling_rounds = config.get_int("rl.sampling_rounds");
  }
  s.verifiable = read_verifiable_rewards(config);
  if (s.sampling_rounds > 1 && s.verifiable.empty()) {
    config.fail_at("rl.sampling_rounds", "drops groups whose rewards from rl.rewards are all equal, but rl.rewards names none "
                                         "(a reward model's scores almost never tie)");
  }
  const int64_t rows = s.prompts_per_rollout * (ppo ? 1 : s.group_size);
  const int64_t batch = config.get_int("train.batch_size");
  if (batch * s.mini_batches != rows) {
    config.fail_at("train.batch_size", "(" + std::to_string(batch) + ") x rl.mini_batches (" + std::to_string(s.mini_batches) +
                                           ") must equal the rollout's " + std::to_string(rows) + " rows (rl.prompts_per_rollout" +
                                           (ppo ? "" : " x rl.group_size") + ")");
  }
  return s;
}

}  // namespace kuafu::chat

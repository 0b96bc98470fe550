// `kuafu-chat ppo benchmark` (also `kuafu-chat benchmark`): a PPO iteration of the configured shape on
// random prompts and random weights, with the four models as a run holds them: actor and critic each
// under its own ModelState (models.actor / models.critic: precision, memory strategy, optimizer), the
// reference and the reward model frozen (memory.offload_frozen). Timed by part: the rollout (KV-cache
// generation, and the same tokens without the cache for the speed-up), the experience (the actor's,
// reference's, critic's and reward model's passes) and a mini-batch's update of actor and critic; the
// memory figures' step peak covers all three. One JSON line.
#pragma once

#include <nlohmann/json.hpp>

#include "apps/chat_rlhf/scored_model.h"
#include "apps/chat_rlhf/stage_config.h"
#include "core/train/benchmark.h"
#include "core/train/model_recipe.h"

namespace kuafu::chat {

// The benchmark's models beside the actor, at its shape and drawn (random weights): the frozen reference
// and reward model, and the critic, which trains.
struct PpoBenchmarkRecipes {
  train::ModelRecipe<nn::CausalLMPtr> reference;
  train::ModelRecipe<ScoredModel> reward, critic;
};
PpoBenchmarkRecipes ppo_benchmark_recipes(const opt::LmShape& shape);

// `actor`: the configured policy, built on runtime.device; the other three models are made beside it.
// `actor_weights`: the actor left described for its sharded strategy (ZeRO, Gemini) to fill, as
// opt::build_for_training leaves it (empty: the actor is materialised).
nlohmann::json benchmark_ppo(const config::Config& config, const train::Runtime& runtime, nn::CausalLMPtr actor,
                             const DeferredWeights& actor_weights, const opt::OptSettings& settings, const RlSettings& rl,
                             train::BenchmarkMemory& memory);

}  // namespace kuafu::chat

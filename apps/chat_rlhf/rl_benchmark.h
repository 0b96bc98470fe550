// `kuafu-chat ppo benchmark` (also `kuafu-chat benchmark`): a PPO step of the configured shape on random
// prompts and random weights, timed by part: the rollout (KV-cache generation, and the same tokens
// without the cache for the speed-up), the experience (the actor's, reference's, critic's and reward
// model's passes), and training (a mini-batch's actor update under the config's memory strategy and
// precision, as the trainer steps it); peak memory with the reference and the reward model as their
// memory.offload_frozen leaves them. One JSON line.
#pragma once

#include <nlohmann/json.hpp>

#include "apps/chat_rlhf/stage_config.h"
#include "core/train/benchmark.h"

namespace kuafu::chat {

// `actor`: the configured policy, built on runtime.device; the other three models are made beside it.
nlohmann::json benchmark_ppo(const config::Config& config, const train::Runtime& runtime, nn::CausalLMPtr actor,
                             const opt::OptSettings& settings, const RlSettings& rl, train::BenchmarkMemory& memory);

}  // namespace kuafu::chat

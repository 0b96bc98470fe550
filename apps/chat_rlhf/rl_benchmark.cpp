#include "apps/chat_rlhf/rl_benchmark.h"

#include <algorithm>

#include "apps/chat_rlhf/experience.h"
#include "core/train/frozen_model.h"
#include "core/train/held_model.h"
#include "core/train/model_recipe.h"
#include "core/train/model_state.h"
#include "core/train/parallelize.h"
#include "core/train/runtime.h"

namespace kuafu::chat {
namespace {

// Greedy decoding that runs the whole sequence again for every new token: generation without a cache.
void generate_without_cache(nn::CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, int64_t new_tokens,
                            const torch::Device& device) {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<int64_t>> rows = prompts;
  for (int64_t t = 0; t < new_tokens; ++t) {
    const Sequences s = make_sequences(rows, std::vector<std::vector<int64_t>>(rows.size()), 1, {}, device);
    const torch::Tensor logits = model.whole_logits(nn::whole_rows_step(s.tokens, s.real)).select(1, -1);  // [B, V]
    const torch::Tensor next = logits.argmax(-1).cpu();
    for (size_t r = 0; r < rows.size(); ++r) rows[r].push_back(next[static_cast<int64_t>(r)].item<int64_t>());
  }
}

}  // namespace

PpoBenchmarkRecipes ppo_benchmark_recipes(const opt::LmShape& shape) {
  const auto drawn = [&shape](std::string name, bool trained, auto describe) {
    using Model = decltype(describe(parallel::ModelOptions()));
    train::ModelRecipe<Model> recipe{std::move(name), trained, describe, [](Model& model) { model->initialize(); }};
    recipe.parameters = static_cast<double>(shape.parameter_count());
    recipe.size_keys = {"model.shape", "model.hidden_size", "model.num_hidden_layers"};
    return recipe;
  };
  const auto describe_scored = train::described<ScoredModel>(shape);
  return {drawn("reference", false, opt::described_lm(shape)), drawn("reward", false, describe_scored),
          drawn("critic", true, describe_scored)};
}

nlohmann::json benchmark_ppo(const config::Config& config, const train::Runtime& runtime, nn::CausalLMPtr actor,
                             const DeferredWeights& actor_weights, const opt::OptSettings& settings, const RlSettings& rl,
                             train::BenchmarkMemory& memory) {
  const torch::Device device = runtime.device;
  const opt::LmShape& shape = settings.model;
  // The other three models are drawn (random weights) and made as a run makes them: the frozen reference
  // and reward model straight in their compute dtype and place (no float32 copy first, none on the device
  // of a model offloaded to the host); the critic, which trains, in float32 or left described for its
  // sharded strategy (ZeRO, Gemini) to fill.
  const train::ModelUse use{train::Purpose::benchmark, runtime.model_options(), /*starting_weights=*/false};
  const PpoBenchmarkRecipes drawn = ppo_benchmark_recipes(shape);
  nn::CausalLMPtr reference = train::build(drawn.reference, config, use).model;
  ScoredModel reward = train::build(drawn.reward, config, use).model;
  train::Built<ScoredModel> critic_built = train::build(drawn.critic, config, use);
  ScoredModel critic = critic_built.model;
  const train::FrozenModel frozen_reference(config.model_view("reference"), runtime, reference->module(),
                                            {"reference", false, train::hooks_through_sites(*reference)});
  const train::FrozenModel frozen_reward(config.model_view("reward"), runtime, *reward,
                                         {"reward", false, train::hooks_through_sites(*reward)});
  // Actor and critic as the trainer holds them: each its own state, from its own config section.
  const config::Config actor_view = config.model_view("actor"), critic_view = config.model_view("critic");
  train::ModelStateOptions actor_options, critic_options;
  actor_options.name = "actor";
  actor_options.deferred = actor_weights;
  actor_options.set_block_hooks = train::hooks_through_sites(*actor);
  critic_options.name = "critic";
  critic_options.set_block_hooks = train::hooks_through_sites(*critic);
  critic_options.deferred = critic_built.deferred;
  train::ModelState actor_state(actor_view, runtime, actor->module(), std::move(actor_options));
  train::ModelState critic_state(critic_view, runtime, *critic, std::move(critic_options));
  for (torch::nn::Module* m : {&actor->module(), &reference->module(), static_cast<torch::nn::Module*>(critic.get()),
                               static_cast<torch::nn::Module*>(reward.get())}) {
    m->eval();  // dropout off in rollouts and updates, as in the trainer
  }
  // This rank's prompts: random tokens, half the context long.
  const int ranks = runtime.mesh->group("data")->size();
  const int64_t rows = std::max<int64_t>(1, rl.prompts_per_rollout / ranks);
  const int64_t new_tokens = std::min<int64_t>(rl.experience.sampling.max_new_tokens, settings.data.context / 2);
  const int64_t prompt_length = std::max<int64_t>(1, settings.data.context - new_tokens);
  torch::manual_seed(settings.train.seed);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < rows; ++r) {
    const torch::Tensor t = torch::randint(3, shape.vocab_size(), {prompt_length}, torch::kInt64);
    prompts.emplace_back(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + prompt_length);
  }
  nn::SamplingOptions sampling = rl.experience.sampling;
  sampling.max_new_tokens = new_tokens;
  sampling.stop_tokens.clear();  // every row the full length: the same work each repeat
  const nn::Decoder decoder = nn::decoder_of(actor);
  const int repeats = 3;  // medians of 3; the run without a cache once (it is the slow one)
  const bool without_cache_timed = config.get_bool("benchmark.generate_without_cache");
  double with_cache = 0, without_cache = 0, experience_s = 0;
  Sequences s;
  Experience e;
  // The rollout, under the actor's and critic's memory strategies, before the timed updates.
  auto rollout = [&] {
    std::vector<std::vector<int64_t>> responses;
    with_cache = train::time_steps([&] { responses = nn::generate(decoder, prompts, sampling); }, 0, repeats, device).median;
    if (without_cache_timed) {
      without_cache =
          train::time_steps([&] { generate_without_cache(*actor, prompts, new_tokens, device); }, 0, 1, device).median;
    }
    s = make_sequences(prompts, responses, 1, {}, device);
    experience_s =
        train::time_steps([&] { e = make_experience(s, *actor, *reference, critic, reward, rl.experience); }, 0, repeats, device)
            .median;
  };
  // Training: one mini-batch's update of actor and critic, as the trainer steps them.
  const int64_t mini_batch = std::max<int64_t>(1, std::min<int64_t>(settings.train.micro_batch_size, rows));
  const torch::Tensor index = torch::arange(mini_batch, torch::TensorOptions(torch::kInt64).device(device));
  train::BenchmarkSpec spec;
  spec.app = "chat-ppo";
  spec.item_name = "tokens";
  spec.items_per_row = prompt_length + new_tokens;
  spec.flops_per_item = 6.0 * 2.0 * static_cast<double>(shape.parameter_count());  // actor and critic
  spec.parameters = shape.parameter_count();
  spec.fields = {{"context", prompt_length + new_tokens}};
  spec.before_steps = rollout;
  nlohmann::json line = train::benchmark_models(actor_view, runtime, {{"", &actor_state}, {"critic", &critic_state}}, [&] {
    const Sequences batch = s.select(index);
    const torch::Tensor mask = e.mask.index_select(0, index);
    const BatchCounts counts = counts_of(mask);
    const torch::Tensor logprobs = response_logprobs(*actor, batch, rl.experience.sampling);
    const PolicyTerms terms = clipped_policy_loss(logprobs, e.logprobs.index_select(0, index), e.advantages.index_select(0, index),
                                                  rl.clip, rl.clip);
    const torch::Tensor values = response_values(critic, batch).values;
    const torch::Tensor value_loss = clipped_value_loss(values, e.values.index_select(0, index).to(values.scalar_type()),
                                                        e.returns.index_select(0, index).to(values.scalar_type()), rl.value_clip);
    return std::vector<torch::Tensor>{aggregate(terms.loss, mask, Aggregation::TokenMean, counts),
                                      rl.value_coef * aggregate(value_loss, mask, Aggregation::TokenMean, counts)};
  }, mini_batch, spec, memory);
  const double generated = static_cast<double>(rows * new_tokens);
  const train::HeldModel& critic_held = train::held_model(config, "critic");
  line["critic_memory_strategy"] = critic_held.strategy;
  line["critic_precision"] = critic_held.precision;
  line["rollout_rows"] = rows;
  line["prompt_tokens"] = prompt_length;
  line["new_tokens"] = new_tokens;
  line["generate_s_kv_cache"] = with_cache;
  line["generate_tokens_per_s_kv_cache"] = generated / with_cache;
  if (without_cache_timed) {
    line["generate_s_no_cache"] = without_cache;
    line["generate_tokens_per_s_no_cache"] = generated / without_cache;
    line["kv_cache_speedup"] = without_cache / with_cache;
  }
  line["experience_s"] = experience_s;
  line["reference_offloaded"] = frozen_reference.offloaded();
  line["reward_offloaded"] = frozen_reward.offloaded();
  // What the frozen models keep in host memory when offloaded (the capacity benchmark's host side).
  line["reference_host_mb"] = static_cast<double>(frozen_reference.host_bytes()) / (1 << 20);
  line["reward_host_mb"] = static_cast<double>(frozen_reward.host_bytes()) / (1 << 20);
  // Or in files on the disk tier (memory.disk_dir), read a block at a time.
  line["reference_disk_mb"] = static_cast<double>(frozen_reference.disk_bytes()) / (1 << 20);
  line["reward_disk_mb"] = static_cast<double>(frozen_reward.disk_bytes()) / (1 << 20);
  // One PPO iteration: the rollout's generation and experience, then rl.epochs passes of updates over it
  // (each of micro-batch rows timed above as step_time_ms_median, actor and critic together).
  const double train_s = line.value("step_time_ms_median", 0.0) / 1000.0;
  line["ppo_iteration_s"] = with_cache + experience_s +
                          train_s * static_cast<double>(rl.steps_per_rollout()) * static_cast<double>(rows / mini_batch) /
                              static_cast<double>(rl.mini_batches);
  return line;
}

}  // namespace kuafu::chat

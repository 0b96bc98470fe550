#include "apps/chat_rlhf/rl_benchmark.h"

#include <algorithm>

#include "apps/chat_rlhf/experience.h"
#include "core/train/frozen_model.h"
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
    const Sequences s = make_sequences(rows, std::vector<std::vector<int64_t>>(rows.size()), 1, std::nullopt, device);
    const torch::Tensor logits = model.whole_logits(nn::whole_rows_step(s.tokens, s.real)).select(1, -1);  // [B, V]
    const torch::Tensor next = logits.argmax(-1).cpu();
    for (size_t r = 0; r < rows.size(); ++r) rows[r].push_back(next[static_cast<int64_t>(r)].item<int64_t>());
  }
}

}  // namespace

nlohmann::json benchmark_ppo(const config::Config& config, const train::Runtime& runtime, nn::CausalLMPtr actor,
                             const opt::OptSettings& settings, const RlSettings& rl, train::BenchmarkMemory& memory) {
  const torch::Device device = runtime.device;
  const opt::LmShape& shape = settings.model;
  const parallel::ModelOptions options = runtime.model_options();
  nn::CausalLMPtr reference = shape.build(options);
  ScoredModel critic(shape, options), reward(shape, options);
  train::ParallelModel reference_sites(*reference, {});
  const train::FrozenModel frozen_reference(config.model_view("reference"), runtime, reference->module(),
                                            {"reference", false, [&](hooks::BlockHooks* h) {
                                               reference_sites.set_block_hooks(h);
                                               return true;
                                             }});
  const train::FrozenModel frozen_reward(config.model_view("reward"), runtime, *reward,
                                         {"reward", false, [&](hooks::BlockHooks* h) {
                                            reward->set_block_hooks(h);
                                            return true;
                                          }});
  for (torch::nn::Module* m : {&actor->module(), &reference->module(), static_cast<torch::nn::Module*>(critic.get()),
                               static_cast<torch::nn::Module*>(reward.get())}) {
    m->eval();
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
  sampling.stop_token.reset();  // every row the full length: the same work each repeat
  const nn::Decoder decoder = nn::decoder_of(actor);
  const int repeats = 3;  // medians of 3; the run without a cache once (it is the slow one)
  std::vector<std::vector<int64_t>> responses;
  const double with_cache =
      train::time_steps([&] { responses = nn::generate(decoder, prompts, sampling); }, 0, repeats, device).median;
  const double without_cache =
      train::time_steps([&] { generate_without_cache(*actor, prompts, new_tokens, device); }, 0, 1, device).median;
  const Sequences s = make_sequences(prompts, responses, 1, std::nullopt, device);
  Experience e;
  const double experience_s =
      train::time_steps([&] { e = make_experience(s, *actor, *reference, critic, reward, rl.experience); }, 0, repeats, device).median;
  // Training: one mini-batch's actor update, as the trainer steps it (ModelState: precision, memory strategy).
  const int64_t mini_batch = std::max<int64_t>(1, std::min<int64_t>(settings.train.micro_batch_size, rows));
  const torch::Tensor index = torch::arange(mini_batch, torch::TensorOptions(torch::kInt64).device(device));
  const Sequences batch = s.select(index);
  const BatchCounts counts = counts_of(e.mask.index_select(0, index));
  train::BenchmarkSpec spec;
  spec.app = "chat-ppo";
  spec.item_name = "tokens";
  spec.items_per_row = prompt_length + new_tokens;
  spec.flops_per_item = 6.0 * static_cast<double>(shape.parameter_count());
  spec.parameters = shape.parameter_count();
  spec.fields = {{"context", prompt_length + new_tokens}};
  train::ParallelModel actor_sites(*actor, {});
  nlohmann::json line = train::benchmark_training(config, runtime, *actor, [&] {
    const torch::Tensor logprobs = response_logprobs(*actor, batch, rl.experience.sampling);
    const PolicyTerms terms = clipped_policy_loss(logprobs, e.logprobs.index_select(0, index), e.advantages.index_select(0, index),
                                                  rl.clip, rl.clip);
    return aggregate(terms.loss, e.mask.index_select(0, index), Aggregation::TokenMean, counts);
  }, mini_batch, spec, memory);
  const double generated = static_cast<double>(rows * new_tokens);
  line["rollout_rows"] = rows;
  line["prompt_tokens"] = prompt_length;
  line["new_tokens"] = new_tokens;
  line["generate_s_kv_cache"] = with_cache;
  line["generate_tokens_per_s_kv_cache"] = generated / with_cache;
  line["generate_s_no_cache"] = without_cache;
  line["generate_tokens_per_s_no_cache"] = generated / without_cache;
  line["kv_cache_speedup"] = without_cache / with_cache;
  line["experience_s"] = experience_s;
  line["reference_offloaded"] = frozen_reference.offloaded();
  line["reward_offloaded"] = frozen_reward.offloaded();
  // One PPO iteration: the rollout's generation and experience, then rl.epochs passes of actor updates
  // over it (each of micro-batch rows timed above as step_time_ms_median; the critic's not counted).
  const double train_s = line.value("step_time_ms_median", 0.0) / 1000.0;
  line["ppo_iteration_s"] = with_cache + experience_s +
                          train_s * static_cast<double>(rl.steps_per_rollout()) * static_cast<double>(rows / mini_batch) /
                              static_cast<double>(rl.mini_batches);
  return line;
}

}  // namespace kuafu::chat

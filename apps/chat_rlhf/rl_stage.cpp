#include "apps/chat_rlhf/rl_stage.h"

#include <cctype>
#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>

#include "apps/chat_rlhf/rl_benchmark.h"
#include "apps/opt_finetune/commands.h"
#include "apps/opt_finetune/task.h"
#include "core/dist/collectives.h"
#include "core/train/frozen_model.h"
#include "core/train/hf_interop.h"
#include "core/train/model_recipe.h"
#include "core/train/peft_adapter.h"
#include "core/util/logging.h"
#include "core/util/seed_mix.h"
#include "core/util/text.h"

namespace kuafu::chat {

double answer_f1(const std::string& answer, const std::string& reference) {
  auto words = [](const std::string& text) {
    std::map<std::string, int> counts;
    std::string word;
    for (const char c : text + " ") {
      if (std::isalnum(static_cast<unsigned char>(c)) || c == '\'') {
        word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      } else if (!word.empty()) {
        ++counts[word];
        word.clear();
      }
    }
    return counts;
  };
  const auto a = words(answer), r = words(reference);
  int common = 0, in_answer = 0, in_reference = 0;
  for (const auto& [w, n] : a) {
    in_answer += n;
    if (const auto found = r.find(w); found != r.end()) common += std::min(n, found->second);
  }
  for (const auto& [w, n] : r) in_reference += n;
  if (common == 0) return 0.0;
  const double precision = static_cast<double>(common) / in_answer, recall = static_cast<double>(common) / in_reference;
  return 2 * precision * recall / (precision + recall);
}

namespace {

int rank_of(const dist::GroupPtr& group) { return group ? group->rank() : 0; }
int ranks_of(const dist::GroupPtr& group) { return group ? group->size() : 1; }

// Sums over the group's ranks (a float64 vector), in place.
void sum_over(torch::Tensor& sums, const dist::GroupPtr& group) {
  if (!group || group->trivial()) return;
  torch::Tensor moved = sums.to(group->device());
  dist::all_reduce(moved, *group);
  sums = moved.cpu();
}

}  // namespace

RlTask::RlTask(Stage stage, RlModels models, RlSettings settings, ChatText text, std::vector<Prompt> prompts,
               std::vector<Prompt> eval_prompts, const train::TrainSettings& train, dist::GroupPtr data,
               std::shared_ptr<io::InstructionBatcher> ptx)
    : stage_(stage), models_(std::move(models)), settings_(std::move(settings)), text_(std::move(text)),
      prompts_(std::move(prompts)), eval_prompts_(std::move(eval_prompts)),
      prompt_order_(static_cast<int64_t>(prompts_.size()), settings_.prompts_per_rollout, train.seed), ptx_(std::move(ptx)),
      data_(std::move(data)), seed_(train.seed), batch_size_(train.batch_size),
      device_(models_.device),
      kl_{settings_.experience.kl_coef, settings_.kl_target, settings_.kl_horizon} {
  // The actor's head, blocks and tail, for the pre-training term's loss.
  actor_sites_ = std::make_unique<train::ParallelModel>(*models_.actor, train::ParallelOptions{});
  settings_.experience.sampling.stop_tokens = text_.format.stop_tokens();
  settings_.experience.sampling.vocab_limit = text_.tokenizer->vocab_size();
  train::freeze(models_.reference->module());
  if (!models_.reward.is_empty()) train::freeze(*models_.reward);
  step_sums_ = torch::zeros({6}, torch::kFloat64);
}

std::vector<train::RunModel> RlTask::models() {
  // Each model's own sites (a scored model's score head in its tail) take the memory strategies.
  std::vector<train::RunModel> out;
  if (models_.shared_trunk) {
    // The actor's parameters and the value head's. Its passes run through both sets of sites: the trunk
    // with the value head and output layer (updates), the policy's own (sampling, experience, ptx).
    train::RunModel actor = train::trained_run_model("actor", **models_.critic, models_.actor_weights);
    actor.set_block_hooks = [this](hooks::BlockHooks* hooks) {
      (*models_.critic)->set_block_hooks(hooks);
      models_.actor->set_block_hooks(hooks);
      return true;
    };
    out.push_back(actor);
  } else {
    out.push_back(train::trained_run_model("actor", *models_.actor, models_.actor_weights));
  }
  if (models_.critic && !models_.shared_trunk) {
    out.push_back(train::trained_run_model("critic", **models_.critic, models_.critic_weights));
  }
  out.push_back(train::frozen_run_model("reference", models_.reference->module(), models_.reference.get()));
  if (!models_.reward.is_empty()) out.push_back(train::frozen_run_model("reward", *models_.reward, models_.reward.get()));
  return out;
}

std::vector<std::vector<int64_t>> RlTask::sample(const std::vector<std::vector<int64_t>>& prompts, nn::SamplingOptions sampling) {
  torch::NoGradGuard no_grad;
  models_.actor->module().eval();  // dropout off: the log-probabilities are those of the distribution sampled
  nn::Decoder decoder = nn::decoder_of(models_.actor);
  // Ranks whose rows stop at different lengths keep decoding together (the actor's layout may gather).
  if (data_ && !data_->trivial()) decoder.all_done = nn::all_done_over(data_);
  return nn::generate(decoder, prompts, sampling);
}

std::vector<std::string> RlTask::answers_of(const std::vector<std::vector<int64_t>>& responses) const {
  std::vector<std::string> answers;
  for (const auto& response : responses) answers.push_back(text_.decode_answer(response));
  return answers;
}

std::vector<double> RlTask::verifiable_scores(const std::vector<std::vector<int64_t>>& responses, const std::vector<std::string>& answers,
                                              const std::vector<const Prompt*>& prompts) const {
  const VerifiableRewards& rewards = settings_.verifiable;
  std::vector<double> scores;
  if (rewards.empty()) return scores;
  for (size_t i = 0; i < responses.size(); ++i) {
    scores.push_back(rewards.score(answers[i], static_cast<int64_t>(responses[i].size()), prompts[i]->answer));
  }
  return scores;
}

torch::Tensor RlTask::on_device(const std::vector<double>& scores) const {
  return scores.empty() ? torch::Tensor() : torch::tensor(scores, torch::kFloat64).to(device_);
}

void RlTask::Samples::append(const Samples& other, size_t first, size_t count) {
  auto take = [&](auto& into, const auto& from) {
    if (!from.empty()) into.insert(into.end(), from.begin() + static_cast<std::ptrdiff_t>(first), from.begin() + static_cast<std::ptrdiff_t>(first + count));
  };
  take(prompts, other.prompts);
  take(responses, other.responses);
  take(sources, other.sources);
  take(answers, other.answers);
  take(program, other.program);
}

RlTask::Samples RlTask::draw_samples(int64_t rollout) {
  const int rank = rank_of(data_), ranks = ranks_of(data_);
  const int64_t per_rank = settings_.prompts_per_rollout / ranks;  // prompts (GRPO: groups) this rank trains on
  const auto group = static_cast<size_t>(stage_ == Stage::Grpo ? settings_.group_size : 1);
  const int64_t rounds = stage_ == Stage::Grpo ? settings_.sampling_rounds : 1;
  nn::SamplingOptions sampling = settings_.experience.sampling;
  Samples kept, dropped;
  auto groups = [&](const Samples& s) { return static_cast<int64_t>(s.prompts.size() / group); };
  for (int64_t round = 0; round < rounds; ++round) {
    // Round r of rollout k samples the prompts of the prompt order's batch k * rounds + r.
    const int64_t batch = rollout * rounds + round;
    Samples drawn;
    for (const size_t index : prompt_order_.rows(batch, rank * per_rank, per_rank)) {
      for (size_t g = 0; g < group; ++g) {
        drawn.prompts.push_back(prompts_[index].tokens);
        drawn.sources.push_back(&prompts_[index]);
      }
    }
    sampling.seed = mix_seed(seed_, batch, 0, rank);
    drawn.responses = sample(drawn.prompts, sampling);
    drawn.answers = answers_of(drawn.responses);
    drawn.program = verifiable_scores(drawn.responses, drawn.answers, drawn.sources);
    if (rounds == 1) return drawn;
    for (size_t first = 0; first < drawn.prompts.size(); first += group) {
      const auto begin = drawn.program.begin() + static_cast<std::ptrdiff_t>(first), end = begin + static_cast<std::ptrdiff_t>(group);
      const bool spread = *std::max_element(begin, end) != *std::min_element(begin, end);
      (spread && groups(kept) < per_rank ? kept : dropped).append(drawn, first, group);
    }
    kept.rounds = round + 1;
    // Every rank samples while any still lacks groups: generation under a sharded layout is collective.
    torch::Tensor short_ranks = torch::tensor({groups(kept) < per_rank ? 1.0 : 0.0}, torch::kFloat64);
    sum_over(short_ranks, data_);
    if (short_ranks.item<double>() == 0) break;
  }
  kept.groups_with_spread = groups(kept);
  // Still short after the last round: groups without spread fill the rollout (they teach only through KL).
  for (size_t first = 0; groups(kept) < per_rank; first += group) kept.append(dropped, first, group);
  return kept;
}

torch::Tensor RlTask::grpo_advantages(const Experience& e) const {
  torch::Tensor rewards = e.scores;  // [B]
  if (settings_.kl_in_reward) {
    const torch::Tensor k1 = kl_estimate(e.logprobs, e.ref_logprobs, KlEstimator::K1) * e.mask.to(e.logprobs.scalar_type());
    rewards = rewards - settings_.experience.kl_coef * k1.sum(1);
  }
  if (settings_.scale_rewards != RewardScaling::Batch || ranks_of(data_) == 1) {
    return group_advantages(rewards, settings_.group_size, settings_.scale_rewards);
  }
  // The batch's standard deviation over every rank's rows.
  const torch::Tensor all = torch::ones_like(rewards, torch::kBool);
  const torch::Tensor std = torch::sqrt(masked_var(rewards, all, data_.get()));
  return group_advantages(rewards, settings_.group_size, RewardScaling::None) / (std + 1e-4);
}

void RlTask::make_rollout(int64_t rollout) {
  const int rank = rank_of(data_);
  const auto started = std::chrono::steady_clock::now();
  const Samples samples = draw_samples(rollout);  // the responses are on the host: the device is done with them
  const auto sampled = std::chrono::steady_clock::now();
  const std::vector<std::vector<int64_t>>& prompts = samples.prompts;
  const std::vector<std::vector<int64_t>>& responses = samples.responses;
  const std::vector<const Prompt*>& sources = samples.sources;
  ExperienceSettings settings = settings_.experience;
  settings.kl_coef = kl_.coef;
  if (settings_.scale_scores) settings.score_moments = &score_moments_;
  settings.policy_logprobs = !update_scores_policy();
  const Sequences s = make_sequences(prompts, responses, text_.pad_id, settings_.experience.sampling.stop_tokens, device_);
  if (!models_.reward.is_empty()) models_.reward->eval();
  const torch::Tensor program = on_device(samples.program);
  if (models_.critic) {
    (*models_.critic)->eval();
    experience_ = make_experience(s, *models_.actor, *models_.reference, *models_.critic, models_.reward, settings, data_.get(),
                                  program);
  } else {
    experience_ = score_samples(s, *models_.actor, *models_.reference, models_.reward, settings, program);
    experience_.advantages = grpo_advantages(experience_).unsqueeze(1) * experience_.mask.to(experience_.ref_logprobs.scalar_type());
  }
  rollout_ = rollout;

  // Each epoch's order of this rank's rows, and each mini-batch's counts over all ranks.
  const auto rows = static_cast<int64_t>(prompts.size());
  const int64_t per_mini_batch = rows / settings_.mini_batches;
  epoch_orders_.clear();
  torch::Tensor counts = torch::zeros({settings_.epochs * settings_.mini_batches, 2}, torch::kFloat64);
  const torch::Tensor tokens_per_row = experience_.mask.sum(1).to(torch::kFloat64).cpu();
  for (int64_t epoch = 0; epoch < settings_.epochs; ++epoch) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed_, rollout, epoch + 1, rank));
    const torch::Tensor order = torch::randperm(rows, generator, torch::kInt64);
    epoch_orders_.emplace_back(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + rows);
    for (int64_t mb = 0; mb < settings_.mini_batches; ++mb) {
      const torch::Tensor chosen = order.narrow(0, mb * per_mini_batch, per_mini_batch);
      counts[epoch * settings_.mini_batches + mb][0] = tokens_per_row.index_select(0, chosen).sum();
      counts[epoch * settings_.mini_batches + mb][1] = static_cast<double>(per_mini_batch);
    }
  }
  sum_over(counts, data_);
  mini_batch_counts_.clear();
  for (int64_t i = 0; i < counts.size(0); ++i) {
    mini_batch_counts_.push_back({counts[i][0].item<double>(), counts[i][1].item<double>(), settings_.experience.sampling.max_new_tokens});
  }

  // The rollout's figures over all ranks: reward, KL per sequence (k1; from the update when it scores
  // the policy), length, EOS, F1 with the reference answer.
  const torch::Tensor m = experience_.mask.to(torch::kFloat64);
  const torch::Tensor k1 = experience_.logprobs.defined()
                               ? (kl_estimate(experience_.logprobs, experience_.ref_logprobs, KlEstimator::K1).to(torch::kFloat64) * m).sum(1)
                               : torch::zeros({rows}, torch::kFloat64);
  double f1 = 0, answered = 0;
  for (size_t r = 0; r < responses.size(); ++r) {
    if (sources[r]->answer.empty()) continue;
    f1 += answer_f1(samples.answers[r], sources[r]->answer);
    answered += 1;
  }
  torch::Tensor sums = torch::tensor({experience_.scores.to(torch::kFloat64).sum().item<double>(), k1.sum().item<double>(),
                                      m.sum().item<double>(), s.ended.to(torch::kFloat64).sum().item<double>(), f1, answered,
                                      static_cast<double>(rows), static_cast<double>(samples.groups_with_spread)},
                                     torch::kFloat64);
  sum_over(sums, data_);
  const double n = sums[6].item<double>();
  rollout_figures_ = {{"reward", sums[0].item<double>() / n},        {"kl", sums[1].item<double>() / n},
                      {"response_length", sums[2].item<double>() / n}, {"eos_rate", sums[3].item<double>() / n},
                      {"kl_coef", kl_.coef}};
  if (settings_.sampling_rounds > 1) {  // GRPO's dynamic sampling (1 for PPO)
    rollout_figures_["groups_with_spread"] = sums[7].item<double>() / static_cast<double>(settings_.prompts_per_rollout);
    rollout_figures_["sampling_rounds"] = static_cast<double>(samples.rounds);  // the same on every rank
  }
  if (sums[5].item<double>() > 0) rollout_figures_["answer_f1"] = sums[4].item<double>() / sums[5].item<double>();
  if (stage_ == Stage::Ppo) kl_.update(sums[1].item<double>() / n, static_cast<int64_t>(n));
  const auto scored = std::chrono::steady_clock::now();  // after the sums' item(), which waits for the device
  rollout_seconds_ = {{"generate_s", std::chrono::duration<double>(sampled - started).count()},
                      {"experience_s", std::chrono::duration<double>(scored - sampled).count()}};
}

bool RlTask::update_scores_policy() const {
  return stage_ == Stage::Grpo && settings_.steps_per_rollout() == 1 && !settings_.kl_in_reward;
}

bool RlTask::sits_out(const std::string& name, int64_t step) const {
  return name == "actor" && step / settings_.steps_per_rollout() < settings_.critic_warmup_rollouts;
}

std::map<std::string, torch::Tensor> RlTask::losses(int64_t step, int64_t first_row, int64_t rows) {
  const int64_t per_rollout = settings_.steps_per_rollout();
  if (step / per_rollout != rollout_) make_rollout(step / per_rollout);
  const int64_t within = step % per_rollout, epoch = within / settings_.mini_batches, mini_batch = within % settings_.mini_batches;
  const int ranks = ranks_of(data_);
  const int64_t per_rank = batch_size_ / ranks;  // this rank's rows of a mini-batch
  const int64_t local_first = first_row / (rows * ranks) * rows;  // micro-steps take `rows` rows of each rank in turn
  std::vector<int64_t> picked;
  for (int64_t i = 0; i < rows; ++i) {
    picked.push_back(epoch_orders_[static_cast<size_t>(epoch)][static_cast<size_t>(mini_batch * per_rank + local_first + i)]);
  }
  const torch::Tensor index = torch::tensor(picked, torch::kInt64).to(device_);
  const Experience& e = experience_;
  const Sequences batch = e.sequences.select(index);
  const torch::Tensor mask = e.mask.index_select(0, index);
  const BatchCounts& counts = mini_batch_counts_[static_cast<size_t>(epoch * settings_.mini_batches + mini_batch)];
  // The trainer averages micro-steps and data ranks; each micro-step's share of the whole mini-batch's
  // loss is scaled back up so that the gradient is the whole mini-batch's, normalised by its counts.
  const double scale = static_cast<double>(batch_size_) / static_cast<double>(rows);

  std::map<std::string, torch::Tensor> result;
  const bool actor_learns = !sits_out("actor", step);
  models_.actor->module().eval();  // dropout off in PPO's updates too: the ratio compares like with like
  const bool with_entropy = settings_.entropy_coef > 0;
  {
    torch::NoGradGuard no_grad;
    step_sums_[3] += mask.to(torch::kFloat64).sum().cpu();  // the response tokens every figure is per
  }
  torch::Tensor values;  // the critic's [B, R]
  if (actor_learns) {
    NextTokens out;
    if (models_.shared_trunk) {  // one pass of the trunk for both
      (*models_.critic)->eval();
      OutputsAndValues both = response_outputs_and_values(*models_.critic, batch, settings_.experience.sampling, with_entropy);
      out = std::move(both.outputs);
      values = both.values.values;
    } else {
      out = response_outputs(*models_.actor, batch, settings_.experience.sampling, with_entropy);
    }
    // The rollout's only update scores the policy itself: its log-probabilities are the sampling weights'.
    const torch::Tensor old_logprobs = e.logprobs.defined() ? e.logprobs.index_select(0, index) : out.logprobs.detach();
    const PolicyTerms terms = clipped_policy_loss(out.logprobs, old_logprobs, e.advantages.index_select(0, index),
                                                  settings_.clip, settings_.clip_high, mask, settings_.importance_level);
    torch::Tensor per_token = terms.loss;
    if (settings_.entropy_coef > 0) per_token = per_token - settings_.entropy_coef * out.entropy;
    if (stage_ == Stage::Grpo && !settings_.kl_in_reward && settings_.experience.kl_coef > 0) {
      per_token = per_token + settings_.experience.kl_coef *
                                  kl_estimate(out.logprobs, e.ref_logprobs.index_select(0, index), settings_.experience.kl_estimator);
    }
    const torch::Tensor actor_loss = aggregate(per_token, mask, settings_.aggregation, counts) * scale;
    {
      torch::NoGradGuard no_grad;
      const torch::Tensor m = mask.to(torch::kFloat64);
      const torch::Tensor log_ratio = (out.logprobs - old_logprobs).to(torch::kFloat64);
      step_sums_.narrow(0, 0, 3) += torch::stack({(terms.clipped.to(torch::kFloat64) * m).sum(), (0.5 * log_ratio.square() * m).sum(),
                                                (terms.ratio.to(torch::kFloat64) * m).sum()})
                                      .cpu();
      if (!e.logprobs.defined()) {
        const torch::Tensor k1 = kl_estimate(out.logprobs.detach(), e.ref_logprobs.index_select(0, index), KlEstimator::K1);
        step_sums_[5] += (k1.to(torch::kFloat64) * m).sum().cpu();
      }
    }
    result["actor"] = actor_loss;
  }
  if (models_.critic) {
    ScoredModel& critic = *models_.critic;
    critic->eval();
    if (!values.defined()) values = response_values(critic, batch).values;
    const torch::Tensor value_loss = clipped_value_loss(values, e.values.index_select(0, index).to(values.scalar_type()),
                                                        e.returns.index_select(0, index).to(values.scalar_type()), settings_.value_clip);
    {
      torch::NoGradGuard no_grad;
      step_sums_[4] += (value_loss.detach().to(torch::kFloat64) * mask.to(torch::kFloat64)).sum().cpu();
    }
    const torch::Tensor critic_loss = settings_.value_coef * aggregate(value_loss, mask, Aggregation::TokenMean, counts) * scale;
    if (models_.shared_trunk) {
      result["actor"] = result["actor"] + critic_loss;  // one model learns from both losses
    } else {
      result["critic"] = critic_loss;
    }
  }
  return result;
}

std::map<std::string, torch::Tensor> RlTask::further_losses(int pass, int64_t step, int64_t first_row, int64_t rows) {
  KUAFU_CHECK(pass == 1 && ptx_, "RL tasks have one further pass, the pre-training term's");
  if (sits_out("actor", step)) return {};
  models_.actor->module().eval();
  const io::TokenBatch ptx = ptx_->train_batch(step, first_row, rows).to(device_);
  // Through the actor's sites, so that its memory strategy (Gemini's gathers, checkpointing) acts on it.
  return {{"actor", settings_.ptx_coef * actor_sites_->loss({ptx.inputs, ptx.targets})}};
}

std::map<std::string, double> RlTask::step_figures(int64_t step) {
  torch::Tensor sums = step_sums_.clone();
  sum_over(sums, data_);
  step_sums_.zero_();
  std::map<std::string, double> figures = rollout_figures_;
  figures.insert(rollout_seconds_.begin(), rollout_seconds_.end());
  rollout_seconds_.clear();  // the next steps of the same rollout did not make it
  const double tokens = std::max(1.0, sums[3].item<double>());
  if (!sits_out("actor", step)) {  // the actor's update's figures (none while the critic warms up)
    figures["clip_fraction"] = sums[0].item<double>() / tokens;
    figures["approx_kl"] = sums[1].item<double>() / tokens;
    figures["ratio"] = sums[2].item<double>() / tokens;
  }
  if (models_.critic) figures["value_loss"] = sums[4].item<double>() / tokens;  // per response token, before rl.value_coef
  if (!experience_.logprobs.defined()) {  // the update scored the policy: the rollout's KL per sequence from it
    const int64_t rows = settings_.prompts_per_rollout * (stage_ == Stage::Grpo ? settings_.group_size : 1);
    figures["kl"] = sums[5].item<double>() / static_cast<double>(rows);
  }
  return figures;
}

io::NamedTensors RlTask::task_state() const {
  io::NamedTensors state = {{"kl_coef", torch::tensor({kl_.coef}, torch::kFloat64)},
                            {"score_moments", torch::tensor({score_moments_.count, score_moments_.mean, score_moments_.var}, torch::kFloat64)}};
  if (rollout_ < 0) return state;
  state.emplace_back("rollout", torch::tensor({rollout_}, torch::kInt64));
  for (const auto& [name, tensor] : experience_tensors(experience_)) state.emplace_back("experience." + name, tensor);
  std::vector<torch::Tensor> orders;
  for (const std::vector<int64_t>& order : epoch_orders_) orders.push_back(torch::tensor(order, torch::kInt64));
  state.emplace_back("epoch_orders", torch::stack(orders));  // [epochs, rows]
  std::vector<double> counts;
  for (const BatchCounts& c : mini_batch_counts_) counts.insert(counts.end(), {c.tokens, c.sequences, static_cast<double>(c.max_length)});
  state.emplace_back("mini_batch_counts", torch::tensor(counts, torch::kFloat64).reshape({-1, 3}));
  for (const auto& [name, value] : rollout_figures_) state.emplace_back("figure." + name, torch::tensor({value}, torch::kFloat64));
  return state;
}

void RlTask::restore_task_state(const io::NamedTensors& state) {
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  if (const auto coef = by_name.find("kl_coef"); coef != by_name.end()) kl_.coef = coef->second.item<double>();
  if (const auto moments = by_name.find("score_moments"); moments != by_name.end()) {
    const torch::Tensor m = moments->second.to(torch::kFloat64);
    score_moments_ = {m[0].item<double>(), m[1].item<double>(), m[2].item<double>()};
  }
  if (!by_name.count("rollout")) return;  // none sampled yet, or a checkpoint without its rollout: sample anew
  io::NamedTensors experience;
  std::map<std::string, double> figures;
  for (const auto& [name, tensor] : state) {
    if (name.rfind("experience.", 0) == 0) experience.emplace_back(name.substr(11), tensor);
    if (name.rfind("figure.", 0) == 0) figures[name.substr(7)] = tensor.item<double>();
  }
  for (const char* needed : {"epoch_orders", "mini_batch_counts"}) {
    KUAFU_CHECK(by_name.count(needed), "the checkpoint's rollout state lacks '", needed, "'");
  }
  experience_ = experience_from(experience, device_);
  const torch::Tensor orders = by_name.at("epoch_orders").contiguous();
  epoch_orders_.clear();
  for (int64_t e = 0; e < orders.size(0); ++e) {
    const torch::Tensor row = orders[e].contiguous();
    epoch_orders_.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  const torch::Tensor counts = by_name.at("mini_batch_counts").contiguous();
  mini_batch_counts_.clear();
  for (int64_t i = 0; i < counts.size(0); ++i) {
    mini_batch_counts_.push_back({counts[i][0].item<double>(), counts[i][1].item<double>(), static_cast<int64_t>(counts[i][2].item<double>())});
  }
  rollout_figures_ = figures;
  rollout_ = by_name.at("rollout").item<int64_t>();
}

train::LossSum RlTask::evaluate(int rank, int ranks) {
  torch::NoGradGuard no_grad;
  const auto n = static_cast<int64_t>(eval_prompts_.size());
  const int64_t first = n * rank / ranks, last = n * (rank + 1) / ranks;
  train::LossSum sums;
  sums.extra.assign(5, 0.0);
  if (first == last) return sums;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<const Prompt*> sources;
  for (int64_t i = first; i < last; ++i) {
    prompts.push_back(eval_prompts_[static_cast<size_t>(i)].tokens);
    sources.push_back(&eval_prompts_[static_cast<size_t>(i)]);
  }
  nn::SamplingOptions greedy = settings_.experience.sampling;
  greedy.temperature = 0;  // the answers a user gets by default
  const std::vector<std::vector<int64_t>> responses = sample(prompts, greedy);
  const Sequences s = make_sequences(prompts, responses, text_.pad_id, settings_.experience.sampling.stop_tokens, device_);
  nn::SamplingOptions model_distribution;
  model_distribution.vocab_limit = greedy.vocab_limit;
  ExperienceSettings settings;
  settings.sampling = model_distribution;
  settings.missing_eos_penalty = settings_.experience.missing_eos_penalty;
  if (!models_.reward.is_empty()) models_.reward->eval();
  const std::vector<std::string> answers = answers_of(responses);
  const Experience e = score_samples(s, *models_.actor, *models_.reference, models_.reward, settings,
                                     on_device(verifiable_scores(responses, answers, sources)));
  const torch::Tensor m = e.mask.to(torch::kFloat64);
  const torch::Tensor kl = (kl_estimate(e.logprobs, e.ref_logprobs, KlEstimator::K1).to(torch::kFloat64) * m).sum(1).cpu();
  const torch::Tensor scores = e.scores.to(torch::kFloat64).cpu();
  for (int64_t i = 0; i < last - first; ++i) {
    const Prompt& p = eval_prompts_[static_cast<size_t>(first + i)];
    sums.loss_sum += -(scores[i].item<double>() - kl_.coef * kl[i].item<double>());
    sums.count += 1;
    sums.correct += s.ended[i].item<bool>() ? 1 : 0;
    sums.extra[0] += scores[i].item<double>();
    sums.extra[1] += kl[i].item<double>();
    sums.extra[2] += static_cast<double>(responses[static_cast<size_t>(i)].size());
    const std::string& answer = answers[static_cast<size_t>(i)];
    sums.extra[3] += p.answer.empty() ? 0 : answer_f1(answer, p.answer);
    sums.extra[4] += settings_.verifiable.answer_right(answer, p.answer) ? 1 : 0;
  }
  return sums;
}

std::vector<train::EvalMetric> RlTask::eval_metrics(const train::LossSum& sums) const {
  const double n = std::max(1.0, sums.count);
  return {{"val_reward", "held-out reward", sums.extra[0] / n, false},
          {"val_kl", "KL to the reference", sums.extra[1] / n, false},
          {"val_length", "length", sums.extra[2] / n, false},
          {"val_eos_rate", "EOS rate", sums.correct / n, true},
          {"val_answer_f1", "answer F1", sums.extra[3] / n, false},
          {"val_exact_match", "exact answers", sums.extra[4] / n, false}};
}

double RlTask::flops_per_item() const {
  // Training's forward and backward per token: the actor, and PPO's critic.
  return 6.0 * static_cast<double>(opt::shape_of(*models_.actor).parameter_count()) * (models_.critic ? 2.0 : 1.0);
}

int64_t RlTask::items_per_row() const {
  double prompt = 0;
  for (const Prompt& p : prompts_) prompt += static_cast<double>(p.tokens.size());
  return std::llround(prompt / static_cast<double>(prompts_.size())) + settings_.experience.sampling.max_new_tokens / 2;
}

namespace {

// A critic's fresh value head starts at zero: the first rollout's values add no noise to its advantages,
// and the trunk learns nothing from the value loss until the head has. A described critic's zeros go to
// the WeightSink in scope (its sharded strategy's).
void zero_value_head(ScoredModel& critic) {
  if (critic->score->weight.is_meta()) {
    train::give_zeros(*critic, [](const std::string& name) { return name.rfind("score.", 0) == 0; });
    return;
  }
  torch::NoGradGuard no_grad;
  critic->score->weight.zero_();
}

// The actor is OPT fine-tuning's model (full or LoRA) in its own section, models.actor, declared by
// kuafu-opt: its export, generation and LoRA are kuafu-opt's; the task, its models and figures are RL's.
class RlApp : public opt::CausalLmApp {
 public:
  RlApp(const config::Config& config, Stage stage)
      : CausalLmApp(config, "actor"), stage_(stage), rl_(rl_settings(config, stage)) {}

  // Each model as the run holds it, from its own section: the actor (its LoRA base frozen) and PPO's
  // critic train; the reference and the reward model are frozen weights in their compute dtype.
  train::ModelSize model_size() override {
    std::vector<train::SizedModel> models = {train::sized(recipe())};
    if (separate_critic()) models.push_back(train::sized(critic_recipe()));
    models.push_back(train::sized(reference_recipe(reference())));
    if (!rl_.reward_model.empty()) models.push_back(train::sized(reward_recipe()));
    return train::size_of(models);
  }
  // The PPO benchmark's: the actor and the other three drawn at its shape.
  train::ModelSize benchmark_size() override {
    const PpoBenchmarkRecipes drawn = ppo_benchmark_recipes(settings_.model);
    return train::size_of({train::sized(recipe()), train::sized(drawn.critic), train::sized(drawn.reference), train::sized(drawn.reward)});
  }
  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override;
  std::string describe(train::RunTask&) override {
    std::ostringstream line;
    line << (stage_ == Stage::Ppo ? "PPO" : "GRPO") << ": " << rl_.prompts_per_rollout << " prompts per rollout"
         << (stage_ == Stage::Grpo ? " x " + std::to_string(rl_.group_size) + " samples" : std::string()) << ", "
         << rl_.epochs << " epoch(s) x " << rl_.mini_batches << " mini-batch(es); actor " << settings_.model.describe();
    return line.str();
  }
  nlohmann::json evaluate(train::RunTask& task, const train::Runtime& runtime) override {
    return train::metrics_line(task, runtime, "prompts");
  }
  torch::nn::Module& build_model(const torch::Device& device, bool starting_weights) override {
    torch::nn::Module& actor = CausalLmApp::build_model(device, starting_weights);
    if (!rl_.shared_trunk) return actor;
    // The checkpoint's actor holds the value head too; generation and export read the decoder.
    with_value_head_.emplace(model(), device);
    return **with_value_head_;
  }
  std::string model_part() const override { return "actor"; }
  nlohmann::json benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) override {
    KUAFU_CHECK(stage_ == Stage::Ppo, "kuafu-chat grpo benchmark: the benchmark times a PPO step (kuafu-chat ppo benchmark)");
    return benchmark_ppo(config_, runtime, model(), deferred(), settings_, rl_, memory);
  }

 private:
  // PPO's critic, a model of its own unless it shares the actor's trunk: the folder of rl.critic_init
  // (or of the reward model) gives its trunk, and its head too or the head starts at zero; nothing is
  // drawn. It trains: float32, or left for its sharded strategy to fill.
  bool separate_critic() const { return stage_ == Stage::Ppo && !rl_.shared_trunk; }
  // The critic's starting folder and the key naming it: rl.critic_init, else the reward model, else (rl.rewards
  // alone) the actor's folder, its head then at zero.
  ReferenceFolder critic_start() const {
    if (!rl_.critic_init.empty()) return {"rl.critic_init", rl_.critic_init};
    if (!rl_.reward_model.empty()) return {"rl.reward_model", rl_.reward_model};
    return {"model.init_from", train::init_from(config_)};
  }
  train::ModelRecipe<ScoredModel> critic_recipe() const {
    const ReferenceFolder from = critic_start();
    const std::string start = from.folder;
    train::ModelRecipe<ScoredModel> critic{"critic"};
    const opt::LmShape shape = read_scored_shape(io::read_hf_config(start), start + "/config.json");
    critic.describe = train::described<ScoredModel>(shape);
    critic.draw = [start](ScoredModel& model) {
      if (!load_scored_weights(model, start)) zero_value_head(model);
    };
    critic.parameters = static_cast<double>(shape.parameter_count());
    critic.size_keys = {from.key};
    return critic;
  }
  ReferenceFolder reference() const { return reference_folder(config_, "rl.reference", rl_.reference); }
  // The frozen reward model, rl.reward_model's folder (kuafu-chat rm export).
  std::string reward_folder() const {
    if (rl_.reward_model.empty()) config_.fail_at("rl.reward_model", "is empty: name the reward model's folder (kuafu-chat rm export)");
    return rl_.reward_model;
  }
  train::ModelRecipe<ScoredModel> reward_recipe() const {
    train::ModelRecipe<ScoredModel> recipe = scored_folder_recipe(reward_folder(), "reward");
    recipe.size_keys = {"rl.reward_model"};
    return recipe;
  }

  Stage stage_;
  RlSettings rl_;
  std::optional<ScoredModel> with_value_head_;  // rl.shared_trunk: build_model's actor with its value head
};

std::unique_ptr<train::RunTask> RlApp::make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) {
  dist::GroupPtr data;
  require_data_parallel(config_, runtime, options, stage_);
  require_rewards(config_, rl_);
  if (runtime) {
    data = runtime->mesh->group("data");
    if (rl_.prompts_per_rollout % data->size() != 0) {
      config_.fail_at("rl.prompts_per_rollout", "(" + std::to_string(rl_.prompts_per_rollout) + ") must divide among the " +
                                                    std::to_string(data->size()) + " data ranks");
    }
  }
  if (data && rl_.eval_prompts_count % data->size() != 0) {
    config_.fail_at("rl.eval_prompts_count", "(" + std::to_string(rl_.eval_prompts_count) + ") must divide among the " +
                                                 std::to_string(data->size()) + " data ranks (they generate together)");
  }
  const ChatText text = chat_text(config_, settings_.data, settings_.model);
  const int64_t room = rl_.experience.sampling.max_new_tokens;
  std::vector<Prompt> prompts = read_prompt_file(config_, "data.train", settings_.data.train, text, 0, room);
  std::vector<Prompt> eval_prompts = read_prompt_file(config_, "rl.eval_prompts", rl_.eval_prompts, text, rl_.eval_prompts_count, room);
  if (static_cast<int64_t>(prompts.size()) < rl_.prompts_per_rollout) {
    config_.fail_at("rl.prompts_per_rollout", "(" + std::to_string(rl_.prompts_per_rollout) + ") exceeds the " +
                                                  std::to_string(prompts.size()) + " prompts of data.train");
  }
  // Training makes each model as the run holds it; an evaluation (no runtime) makes them all whole in
  // float32, as it runs them.
  const train::Purpose purpose = runtime ? train::Purpose::train : train::Purpose::evaluate;
  RlModels models;
  models.device = options.device;
  // The actor as kuafu-opt trains it, from its own section (models.actor): its LoRA base in the compute
  // dtype, or left described for ZeRO and Gemini.
  train::Built<nn::CausalLMPtr> actor = train::build(recipe(), config_, {purpose, options});
  models.actor = actor.model;
  models.actor_weights = std::move(actor.deferred);
  // The frozen reference and reward models are made as the run holds them: in their compute dtype (their
  // config sections' precision.dtype), in host memory under their memory.offload_frozen.
  const ReferenceFolder reference_folder = reference();
  models.reference = train::build(reference_recipe(reference_folder), config_, {purpose, options}).model;
  // All four read the actor's tokens: the same family and vocabulary.
  check_same_tokens(config_, reference_folder.key, reference_folder.folder, *models.reference, *models.actor, "the actor", *text.tokenizer);
  if (!rl_.reward_model.empty()) {
    models.reward = train::build(reward_recipe(), config_, {purpose, options}).model;
    check_same_tokens(config_, "rl.reward_model", rl_.reward_model, *models.reward->lm, *models.actor, "the actor", *text.tokenizer);
  }
  if (rl_.verifiable.checks_answers()) {  // every prompt needs the answer its responses are checked against
    for (const auto& [key, set] : {std::pair<const char*, const std::vector<Prompt>*>{"data.train", &prompts},
                                   {"rl.eval_prompts", &eval_prompts}}) {
      for (const Prompt& p : *set) {
        if (p.answer.empty()) {
          config_.fail_at(key, "holds the prompt \"" + text::abbreviate(p.text) + "\" without an \"answer\", which rl.rewards' "
                               "exact_answer checks");
        }
      }
    }
  }
  if (rl_.shared_trunk) {
    // The value head on the actor's trunk, fresh at zero (the reward model's head reads another trunk);
    // described with a described actor, its zeros then go to the strategy with the actor's weights.
    const bool described = static_cast<bool>(models.actor_weights);
    models.critic.emplace(models.actor, described ? torch::Device(torch::kMeta) : options.device, /*reads_logits=*/true);
    models.shared_trunk = true;
    if (described) {
      models.actor_weights.initialize = [actor = models.actor_weights.initialize, critic = *models.critic]() mutable {
        actor();
        zero_value_head(critic);
      };
    } else {
      zero_value_head(*models.critic);
    }
  } else if (separate_critic()) {
    train::Built<ScoredModel> built = train::build(critic_recipe(), config_, {purpose, parallel::ModelOptions::serial_on(options.device)});
    models.critic.emplace(built.model);
    models.critic_weights = std::move(built.deferred);
  }
  std::shared_ptr<io::InstructionBatcher> ptx;
  if (rl_.ptx_coef > 0) {
    auto set = std::make_shared<io::InstructionSet>(io::read_instructions(settings_.data.train, *text.tokenizer, text.format));
    ptx = std::make_shared<io::InstructionBatcher>(set, text.pad_id, settings_.train.batch_size, settings_.train.seed);
  }
  return std::make_unique<RlTask>(stage_, std::move(models), rl_, text, std::move(prompts), std::move(eval_prompts),
                                  settings_.train, data, ptx);
}

}  // namespace

std::unique_ptr<train::App> make_rl_app(const config::Config& config, Stage stage) {
  return std::make_unique<RlApp>(config, stage);
}

}  // namespace kuafu::chat

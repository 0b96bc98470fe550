#include "apps/chat_rlhf/experience.h"

#include <algorithm>
#include <map>

#include "apps/chat_rlhf/policy.h"
#include "core/util/error.h"

namespace kuafu::chat {

torch::Tensor Sequences::response_mask() const {
  return torch::arange(response_width, response_length.options()).unsqueeze(0) < response_length.unsqueeze(1);
}

torch::Tensor Sequences::at_responses(const torch::Tensor& per_column, int64_t shift) const {
  const int64_t columns = per_column.size(1);
  const torch::Tensor index = (response_start.unsqueeze(1) + shift +
                               torch::arange(response_width, response_start.options()).unsqueeze(0))
                                  .clamp(0, columns - 1);  // past a response's end: read anywhere, masked later
  return per_column.gather(1, index) * response_mask().to(per_column.scalar_type());
}

Sequences Sequences::select(const torch::Tensor& rows) const {
  return {tokens.index_select(0, rows), real.index_select(0, rows), response_start.index_select(0, rows),
          response_length.index_select(0, rows), ended.index_select(0, rows), response_width};
}

Sequences make_sequences(const std::vector<std::vector<int64_t>>& prompts, const std::vector<std::vector<int64_t>>& responses,
                         int64_t pad_id, const std::vector<int64_t>& stop_tokens, const torch::Device& device, bool right_padded) {
  KUAFU_CHECK(prompts.size() == responses.size() && !prompts.empty(), "make_sequences takes one response per prompt");
  const auto rows = static_cast<int64_t>(prompts.size());
  int64_t prompt_width = 0, response_width = 1, total = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    KUAFU_CHECK(!prompts[r].empty(), "prompt ", r, " has no tokens");
    prompt_width = std::max<int64_t>(prompt_width, static_cast<int64_t>(prompts[r].size()));
    response_width = std::max<int64_t>(response_width, static_cast<int64_t>(responses[r].size()));
    total = std::max<int64_t>(total, static_cast<int64_t>(prompts[r].size() + responses[r].size()));
  }
  const int64_t width = right_padded ? total : prompt_width + response_width;
  torch::Tensor tokens = torch::full({rows, width}, pad_id, torch::kInt64);
  torch::Tensor real = torch::zeros({rows, width}, torch::kBool);
  torch::Tensor start = torch::zeros({rows}, torch::kInt64), length = torch::zeros({rows}, torch::kInt64);
  torch::Tensor ended = torch::zeros({rows}, torch::kBool);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> row = prompts[static_cast<size_t>(r)];
    const std::vector<int64_t>& response = responses[static_cast<size_t>(r)];
    row.insert(row.end(), response.begin(), response.end());
    const auto p = static_cast<int64_t>(prompts[static_cast<size_t>(r)].size());
    const int64_t first = right_padded ? 0 : prompt_width - p;  // the row's first real column
    tokens[r].narrow(0, first, static_cast<int64_t>(row.size())).copy_(torch::tensor(row, torch::kInt64));
    real[r].narrow(0, first, static_cast<int64_t>(row.size())).fill_(true);
    start[r] = first + p;
    length[r] = static_cast<int64_t>(response.size());
    ended[r] = !response.empty() && std::find(stop_tokens.begin(), stop_tokens.end(), response.back()) != stop_tokens.end();
  }
  return {tokens.to(device), real.to(device), start.to(device), length.to(device), ended.to(device), response_width};
}

namespace {

// Next-token outputs [B, T - 1] read at the responses [B, R]: column c is about the token at column c + 1.
NextTokens at_responses(NextTokens next, const Sequences& s) {
  next.logprobs = s.at_responses(next.logprobs, -1);
  if (next.entropy.defined()) next.entropy = s.at_responses(next.entropy, -1);
  return next;
}

// Values [B, T] (V after each column's token) read at the responses, and the bootstrap after the last.
ValueEstimates values_at_responses(const torch::Tensor& values, const Sequences& s) {
  const torch::Tensor last = (s.response_start + s.response_length - 1).clamp_min(0);
  const torch::Tensor after_last = values.gather(1, last.unsqueeze(1)).squeeze(1);
  return {s.at_responses(values, -1), after_last * s.ended.logical_not().to(after_last.scalar_type())};
}

}  // namespace

NextTokens response_outputs(nn::CausalLM& policy, const Sequences& s, const nn::SamplingOptions& sampling,
                            bool with_entropy) {
  return at_responses(next_token_outputs(policy, s.tokens, s.real, sampling, with_entropy), s);
}

torch::Tensor response_logprobs(nn::CausalLM& policy, const Sequences& s, const nn::SamplingOptions& sampling) {
  return response_outputs(policy, s, sampling, /*with_entropy=*/false).logprobs;
}

ValueEstimates response_values(ScoredModel& critic, const Sequences& s) {
  return values_at_responses(critic->values(s.tokens, s.real), s);
}

OutputsAndValues response_outputs_and_values(ScoredModel& shared, const Sequences& s, const nn::SamplingOptions& sampling,
                                             bool with_entropy) {
  const ScoredModelImpl::ValuesAndLogits both = shared->values_and_logits(s.tokens, s.real);
  return {at_responses(next_token_outputs_of(both.logits, s.tokens, sampling, with_entropy), s), values_at_responses(both.values, s)};
}

torch::Tensor sequence_scores(ScoredModel& reward, const Sequences& s) { return reward->scores(s.tokens, s.real); }

namespace {

// Each tensor of an Experience (const or not) and of its Sequences, by name.
template <typename AnyExperience, typename Visit>
void for_each_field(AnyExperience& e, Visit visit) {
  auto& s = e.sequences;
  visit("tokens", s.tokens), visit("real", s.real), visit("response_start", s.response_start),
      visit("response_length", s.response_length), visit("ended", s.ended), visit("mask", e.mask),
      visit("logprobs", e.logprobs), visit("ref_logprobs", e.ref_logprobs), visit("values", e.values),
      visit("bootstrap", e.bootstrap), visit("scores", e.scores), visit("kl", e.kl), visit("rewards", e.rewards),
      visit("advantages", e.advantages), visit("returns", e.returns);
}

}  // namespace

io::NamedTensors experience_tensors(const Experience& e) {
  io::NamedTensors out;
  for_each_field(e, [&](const char* name, const torch::Tensor& t) {
    if (t.defined()) out.emplace_back(name, t.detach().cpu());
  });
  out.emplace_back("response_width", torch::tensor({e.sequences.response_width}, torch::kInt64));
  return out;
}

Experience experience_from(const io::NamedTensors& tensors, const torch::Device& device) {
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  Experience e;
  for_each_field(e, [&](const char* name, torch::Tensor& t) {
    if (const auto found = by_name.find(name); found != by_name.end()) t = found->second.to(device);
  });
  for (const char* needed : {"tokens", "real", "response_start", "response_length", "ended", "mask", "ref_logprobs",
                             "scores", "advantages", "response_width"}) {
    KUAFU_CHECK(by_name.count(needed), "the saved rollout lacks '", needed, "'");
  }
  e.sequences.response_width = by_name.at("response_width").item<int64_t>();
  return e;
}

Experience score_samples(const Sequences& s, nn::CausalLM& policy, nn::CausalLM& reference,
                         ScoredModel& reward, const ExperienceSettings& settings, const torch::Tensor& program_scores) {
  torch::NoGradGuard no_grad;
  Experience e;
  e.sequences = s;
  e.mask = s.response_mask();
  e.ref_logprobs = response_logprobs(reference, s, settings.sampling);
  const auto score_options = e.ref_logprobs.options().dtype(e.ref_logprobs.scalar_type());
  e.scores = reward.is_empty() ? torch::zeros({s.tokens.size(0)}, score_options)
                               : sequence_scores(reward, s).to(e.ref_logprobs.scalar_type());
  if (program_scores.defined()) e.scores = e.scores + program_scores.to(score_options);
  if (settings.missing_eos_penalty != 0) e.scores = e.scores + settings.missing_eos_penalty * s.ended.logical_not().to(e.scores.scalar_type());
  if (!settings.policy_logprobs) return e;
  e.logprobs = response_logprobs(policy, s, settings.sampling);
  e.kl = kl_estimate(e.logprobs, e.ref_logprobs, settings.kl_estimator) * e.mask.to(e.logprobs.scalar_type());
  return e;
}

Experience make_experience(const Sequences& s, nn::CausalLM& policy, nn::CausalLM& reference,
                           ScoredModel& critic, ScoredModel& reward, const ExperienceSettings& settings,
                           const dist::ProcessGroup* group, const torch::Tensor& program_scores) {
  torch::NoGradGuard no_grad;
  Experience e = score_samples(s, policy, reference, reward, settings, program_scores);
  const ValueEstimates v = response_values(critic, s);
  e.values = v.values;
  e.bootstrap = settings.bootstrap_truncated ? v.bootstrap : torch::zeros_like(v.bootstrap);
  // e.scores stay the reward model's (the figures report them); the rewards take them scaled.
  if (settings.score_moments) settings.score_moments->update(e.scores, group);
  const torch::Tensor scores = scale_scores(e.scores, settings.score_moments, settings.score_subtract_mean, settings.score_clip);
  e.rewards = token_rewards(scores, e.kl, e.mask, settings.kl_coef);
  const Advantages a = gae(e.rewards, e.values.to(e.rewards.scalar_type()), e.mask, e.bootstrap.to(e.rewards.scalar_type()),
                           settings.gamma, settings.lambda);
  e.returns = a.returns;
  e.advantages = settings.whiten_advantages ? whiten(a.advantages, e.mask, true, group) : a.advantages;
  return e;
}

}  // namespace kuafu::chat

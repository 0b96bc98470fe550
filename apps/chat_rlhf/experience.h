// PPO's experience: sampled responses scored by the four models. Sequences are model rows of a prompt
// and its response with padding anywhere (generation left-pads prompts and right-pads responses); what
// the policy update reads is gathered per response token into [B, R] tensors aligned at each response's
// first token, so nothing downstream depends on where a row's padding was.
#pragma once

#include <optional>
#include <vector>

#include "apps/chat_rlhf/advantages.h"
#include "apps/chat_rlhf/policy.h"
#include "apps/chat_rlhf/policy_losses.h"
#include "apps/chat_rlhf/scored_model.h"
#include "core/io/safetensors.h"
#include "core/nn/generation.h"

namespace kuafu::chat {

struct Sequences {
  torch::Tensor tokens;           // [B, T]
  torch::Tensor real;             // [B, T] bool
  torch::Tensor response_start;   // [B]: the column of each row's first response token
  torch::Tensor response_length;  // [B]: its real response tokens (EOS included)
  torch::Tensor ended;            // [B] bool: the response ended with the stop token (else cut at the limit)
  int64_t response_width = 0;     // R: the longest response

  torch::Tensor response_mask() const;  // [B, R]
  Sequences select(const torch::Tensor& rows) const;  // the rows `rows` [n] (int64 indices), as a batch of n
  // per_column [B, T'] read at each response token's column + `shift` (−1: the position that predicts it) -> [B, R].
  torch::Tensor at_responses(const torch::Tensor& per_column, int64_t shift) const;
};

// Prompts left-padded to the longest and responses right-padded after them (as generation lays them
// out), or with `right_padded` every row's prompt and response together at column 0. A response ended
// when its last token is one of `stop_tokens` (else the length limit cut it).
Sequences make_sequences(const std::vector<std::vector<int64_t>>& prompts, const std::vector<std::vector<int64_t>>& responses,
                         int64_t pad_id, const std::vector<int64_t>& stop_tokens, const torch::Device& device,
                         bool right_padded = false);

// The policy's log-probabilities [B, R] of the responses, as the sampler drew them.
torch::Tensor response_logprobs(nn::CausalLM& policy, const Sequences& s, const nn::SamplingOptions& sampling);
// The same with the entropy [B, R] of each response token's distribution (when asked).
NextTokens response_outputs(nn::CausalLM& policy, const Sequences& s, const nn::SamplingOptions& sampling,
                            bool with_entropy);

struct ValueEstimates {
  torch::Tensor values;     // [B, R]: V of the state before each response token
  torch::Tensor bootstrap;  // [B]: V after the last token for a response cut at the limit, 0 for one that ended
};
ValueEstimates response_values(ScoredModel& critic, const Sequences& s);

// A shared trunk's actor outputs and values from one pass (rl.shared_trunk; `shared` built with reads_logits).
struct OutputsAndValues {
  NextTokens outputs;
  ValueEstimates values;
};
OutputsAndValues response_outputs_and_values(ScoredModel& shared, const Sequences& s, const nn::SamplingOptions& sampling,
                                             bool with_entropy);

// The reward model's score [B] at each row's last real token (its response's last).
torch::Tensor sequence_scores(ScoredModel& reward, const Sequences& s);

// How experience becomes advantages.
struct ExperienceSettings {
  nn::SamplingOptions sampling;
  KlEstimator kl_estimator = KlEstimator::K1;
  double kl_coef = 0.05;
  double missing_eos_penalty = 0;  // added to the score of a response cut at the limit (e.g. −1)
  double gamma = 1.0, lambda = 0.95;
  // False: a response cut at the limit ends its episode like one that ended (the reward model scored the
  // cut text; a value past the cut would count the rest twice). True: V after its last token is bootstrapped.
  bool bootstrap_truncated = false;
  // The scores' scaling before they become rewards (rl.score_scaling, rl.score_clip): the running moments to
  // update with each rollout's scores and divide by (null: none), whether to subtract their mean, the clip.
  RunningMoments* score_moments = nullptr;
  bool score_subtract_mean = false;
  double score_clip = 0;
  bool whiten_advantages = true;
  // False: the policy's log-probabilities (and the KL) are left to the update, whose own they are when
  // it is the rollout's only one (GRPO, one epoch of one mini-batch, KL not in the reward: as trl does).
  bool policy_logprobs = true;
};

struct Experience {
  Sequences sequences;
  torch::Tensor mask;                        // [B, R]
  torch::Tensor logprobs, ref_logprobs;      // [B, R] (logprobs undefined without policy_logprobs)
  torch::Tensor values, bootstrap;           // [B, R], [B]
  torch::Tensor scores;                      // [B]: the reward model's and the program's, penalty included
  torch::Tensor kl;                          // [B, R]: the estimator's per-token KL to the reference
  torch::Tensor rewards, advantages, returns;  // [B, R]
};

// The experience as named tensors (undefined ones left out), for a checkpoint, and back on `device`;
// kuafu::Error naming what is missing.
io::NamedTensors experience_tensors(const Experience& e);
Experience experience_from(const io::NamedTensors& tensors, const torch::Device& device);

// What PPO and GRPO share: the policy's and the reference's log-probabilities, the scores (the reward
// model's, when `reward` holds one, plus `program_scores` [B], the rewards a program checked, when defined;
// the penalty included) and the per-token KL (no gradients; models in eval mode).
Experience score_samples(const Sequences& s, nn::CausalLM& policy, nn::CausalLM& reference,
                         ScoredModel& reward, const ExperienceSettings& settings, const torch::Tensor& program_scores = {});

// Scores `s` with the policy, the reference, the critic and the reward model (no gradients; call with
// the models in eval mode, dropout off) and computes rewards, GAE and (whitened over `group`'s ranks)
// advantages.
Experience make_experience(const Sequences& s, nn::CausalLM& policy, nn::CausalLM& reference,
                           ScoredModel& critic, ScoredModel& reward, const ExperienceSettings& settings,
                           const dist::ProcessGroup* group = nullptr, const torch::Tensor& program_scores = {});

}  // namespace kuafu::chat

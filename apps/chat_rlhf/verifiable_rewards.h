// Rewards a program checks (RLVR, as DeepSeek-R1 and DAPO train reasoning): each response's text scored
// against its prompt's reference answer by named terms, weighted and summed, beside or instead of a reward
// model (rl.rewards, rl.reward_weights):
//   exact_answer  1 when the answer extracted from the response equals the reference, else 0. The answer is
//                 the last match of rl.answer_pattern (its first group, or the whole match; by default the
//                 last number); two numbers are equal as numbers ("1,000" = "1000.0"), other text after
//                 trimming whitespace and a final full stop;
//   format        1 when rl.format_pattern matches somewhere in the response (anchor it with ^ and $ to ask
//                 for the whole), else 0;
//   overlong      DAPO's soft overlong punishment: 0 up to L_max − rl.overlong_buffer tokens, falling
//                 linearly to −1 at L_max = generate.max_new_tokens (a response cut at the limit gets −1).
#pragma once

#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "core/config/config.h"

namespace kuafu::chat {

enum class RewardTermKind { ExactAnswer, Format, Overlong };

struct RewardTerm {
  RewardTermKind kind;
  double weight = 1.0;
};

struct VerifiableRewards {
  std::vector<RewardTerm> terms;  // empty: none (a reward model alone)
  std::regex answer_pattern, format_pattern;
  int64_t max_tokens = 0, overlong_buffer = 0;

  bool empty() const { return terms.empty(); }
  bool checks_answers() const;  // whether exact_answer is one of the terms
  // Whether the answer answer_pattern extracts from `response` equals `reference` (exact_answer's test).
  bool answer_right(const std::string& response, const std::string& reference) const;
  // The weighted sum for one response of `tokens` tokens (its text `response`) to a prompt whose reference
  // answer is `reference`.
  double score(const std::string& response, int64_t tokens, const std::string& reference) const;
};

// The answer `pattern` extracts from `text`: its last match's first group (the whole match without
// groups); nullopt when it does not match.
std::optional<std::string> extract_answer(const std::string& text, const std::regex& pattern);
// Whether an extracted answer equals the reference: as numbers when both read as one, else as trimmed text.
bool same_answer(const std::string& answer, const std::string& reference);
// DAPO's soft overlong punishment of a response of `tokens` tokens (0 when `buffer` is 0).
double overlong_penalty(int64_t tokens, int64_t max_tokens, int64_t buffer);

// rl.rewards and friends, checked at their keys (an unknown term, weights of another count, a pattern that
// does not compile, a buffer past generate.max_new_tokens).
VerifiableRewards read_verifiable_rewards(const config::Config& config);
// The schema keys (rl.rewards, rl.reward_weights, rl.answer_pattern, rl.format_pattern, rl.overlong_buffer).
void add_verifiable_reward_keys(config::Schema& schema);

}  // namespace kuafu::chat

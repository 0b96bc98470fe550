#include "apps/chat_rlhf/verifiable_rewards.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::chat {
namespace {

// The last number of a response (an optional sign, digits with thousands commas, a decimal part).
constexpr const char* kLastNumber = R"((-?[0-9][0-9,]*(\.[0-9]+)?))";

// Without surrounding whitespace or a final full stop ("The answer is 42.").
std::string trimmed(std::string_view s) {
  std::string out = text::trim(s);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

// `text` as a number when the whole of it is one (thousands commas allowed).
std::optional<double> as_number(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), ','), text.end());
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::regex compile_at(const config::Config& config, const std::string& key, const std::string& pattern) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    config.fail_at(key, "= \"" + pattern + "\" is not a regular expression (ECMAScript): " + e.what());
  }
}

}  // namespace

bool VerifiableRewards::checks_answers() const {
  return std::any_of(terms.begin(), terms.end(), [](const RewardTerm& t) { return t.kind == RewardTermKind::ExactAnswer; });
}

bool VerifiableRewards::answer_right(const std::string& response, const std::string& reference) const {
  const std::optional<std::string> answer = extract_answer(response, answer_pattern);
  return answer && same_answer(*answer, reference);
}

double VerifiableRewards::score(const std::string& response, int64_t tokens, const std::string& reference) const {
  double total = 0;
  for (const RewardTerm& term : terms) {
    double value = 0;
    switch (term.kind) {
      case RewardTermKind::ExactAnswer:
        value = answer_right(response, reference) ? 1.0 : 0.0;
        break;
      case RewardTermKind::Format:
        value = std::regex_search(response, format_pattern) ? 1.0 : 0.0;
        break;
      case RewardTermKind::Overlong:
        value = overlong_penalty(tokens, max_tokens, overlong_buffer);
        break;
    }
    total += term.weight * value;
  }
  return total;
}

std::optional<std::string> extract_answer(const std::string& text, const std::regex& pattern) {
  std::optional<std::string> last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern); it != std::sregex_iterator(); ++it) {
    const std::smatch& match = *it;
    last = match.size() > 1 && match[1].matched ? match[1].str() : match[0].str();
  }
  return last;
}

bool same_answer(const std::string& answer, const std::string& reference) {
  const std::string a = trimmed(answer), r = trimmed(reference);
  const std::optional<double> x = as_number(a), y = as_number(r);
  if (x && y) return std::abs(*x - *y) <= 1e-9 * std::max(1.0, std::abs(*y));
  return !r.empty() && a == r;
}

double overlong_penalty(int64_t tokens, int64_t max_tokens, int64_t buffer) {
  if (buffer <= 0 || tokens <= max_tokens - buffer) return 0.0;
  if (tokens >= max_tokens) return -1.0;
  return static_cast<double>(max_tokens - buffer - tokens) / static_cast<double>(buffer);
}

void add_verifiable_reward_keys(config::Schema& s) {
  s.add_string_list("rl.rewards", {},
                    "rewards a program checks, summed with the reward model's score (if any): exact_answer, format, "
                    "overlong");
  s.add_float_list("rl.reward_weights", {}, "each rl.rewards term's weight (empty: 1 each)");
  s.add_string("rl.answer_pattern", kLastNumber,
               "exact_answer: the answer is this pattern's last match in the response (its first group), compared "
               "with the prompt's \"answer\" (or \"response\")");
  s.add_string("rl.format_pattern", "", "format: 1 when this pattern matches the response (ECMAScript; ^...$ for all of it)");
  s.add_int("rl.overlong_buffer", 0, "overlong: the last tokens before generate.max_new_tokens over which the penalty grows to -1")
      .min(0);
}

VerifiableRewards read_verifiable_rewards(const config::Config& config) {
  VerifiableRewards r;
  const std::vector<std::string> names = config.get_string_list("rl.rewards");
  const std::vector<double> weights = config.get_float_list("rl.reward_weights");
  if (!weights.empty() && weights.size() != names.size()) {
    config.fail_at("rl.reward_weights", "has " + std::to_string(weights.size()) + " weights for the " + std::to_string(names.size()) +
                                            " terms of rl.rewards");
  }
  for (size_t i = 0; i < names.size(); ++i) {
    RewardTerm term{RewardTermKind::ExactAnswer, weights.empty() ? 1.0 : weights[i]};
    if (names[i] == "format") {
      term.kind = RewardTermKind::Format;
    } else if (names[i] == "overlong") {
      term.kind = RewardTermKind::Overlong;
    } else if (names[i] != "exact_answer") {
      config.fail_at("rl.rewards", "names \"" + names[i] + "\"; the terms are exact_answer, format and overlong");
    }
    r.terms.push_back(term);
  }
  r.answer_pattern = compile_at(config, "rl.answer_pattern", config.get_string("rl.answer_pattern"));
  const std::string format = config.get_string("rl.format_pattern");
  const bool formats = std::any_of(r.terms.begin(), r.terms.end(), [](const RewardTerm& t) { return t.kind == RewardTermKind::Format; });
  if (formats && format.empty()) config.fail_at("rl.format_pattern", "is empty, but rl.rewards names format");
  r.format_pattern = compile_at(config, "rl.format_pattern", format);
  r.max_tokens = config.get_int("generate.max_new_tokens");
  r.overlong_buffer = config.get_int("rl.overlong_buffer");
  const bool overlong = std::any_of(r.terms.begin(), r.terms.end(), [](const RewardTerm& t) { return t.kind == RewardTermKind::Overlong; });
  if (overlong && (r.overlong_buffer <= 0 || r.overlong_buffer > r.max_tokens)) {
    config.fail_at("rl.overlong_buffer", "(" + std::to_string(r.overlong_buffer) + ") must lie in 1..generate.max_new_tokens (" +
                                             std::to_string(r.max_tokens) + ") when rl.rewards names overlong");
  }
  return r;
}

}  // namespace kuafu::chat

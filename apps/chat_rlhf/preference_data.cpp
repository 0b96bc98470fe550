#include "apps/chat_rlhf/preference_data.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/util/error.h"

namespace kuafu::chat {

PreferenceSet read_preferences(const std::string& path, const io::BpeTokenizer& tokenizer, const io::InstructionFormat& format) {
  PreferenceSet set;
  io::read_jsonl(path, [&](const nlohmann::json& item, const std::string& where) {
    const std::string prompt = io::text_field(item, "prompt", where);
    const std::string chosen = io::text_field(item, "chosen", where), rejected = io::text_field(item, "rejected", where);
    KUAFU_CHECK(chosen != rejected, where, ": \"chosen\" and \"rejected\" are the same answer");
    const std::string kind = item.contains("kind") ? io::text_field(item, "kind", where) : "";
    PreferencePair pair;
    pair.chosen = io::make_example(io::exchange_segments(prompt, chosen, format, where), tokenizer, format);
    pair.rejected = io::make_example(io::exchange_segments(prompt, rejected, format, where), tokenizer, format);
    const auto longest = static_cast<int64_t>(std::max(pair.chosen.tokens.size(), pair.rejected.tokens.size()));
    if (format.max_tokens > 0 && longest > format.max_tokens) {
      ++set.skipped_too_long;
      return;
    }
    auto found = std::find(set.kinds.begin(), set.kinds.end(), kind);
    if (found == set.kinds.end()) found = set.kinds.insert(set.kinds.end(), kind);
    pair.kind = static_cast<int>(found - set.kinds.begin());
    set.pairs.push_back(std::move(pair));
  });
  return set;
}

PairRows pair_rows(const PreferenceSet& set, const std::vector<size_t>& pairs, int64_t pad_id, const torch::Device& device) {
  const auto n = static_cast<int64_t>(pairs.size());
  int64_t longest = 1;
  for (size_t p : pairs) {
    longest = std::max({longest, static_cast<int64_t>(set.pairs[p].chosen.tokens.size()),
                        static_cast<int64_t>(set.pairs[p].rejected.tokens.size())});
  }
  const int64_t width = (longest + 7) / 8 * 8;
  torch::Tensor tokens = torch::full({2 * n, width}, pad_id, torch::kInt64);
  torch::Tensor real = torch::zeros({2 * n, width}, torch::kBool), learned = torch::zeros({2 * n, width}, torch::kBool);
  PairRows rows;
  auto put = [&](int64_t row, const io::InstructionExample& e) {
    const auto length = static_cast<int64_t>(e.tokens.size());
    tokens[row].narrow(0, 0, length).copy_(torch::tensor(e.tokens, torch::kInt64));
    real[row].narrow(0, 0, length).fill_(true);
    learned[row].narrow(0, 0, length).copy_(torch::tensor(std::vector<int64_t>(e.learned.begin(), e.learned.end())).to(torch::kBool));
  };
  for (int64_t i = 0; i < n; ++i) {
    const PreferencePair& pair = set.pairs[pairs[static_cast<size_t>(i)]];
    put(i, pair.chosen);
    put(n + i, pair.rejected);
    rows.kinds.push_back(pair.kind);
    rows.pairs.push_back(pairs[static_cast<size_t>(i)]);
  }
  rows.tokens = tokens.to(device);
  rows.real = real.to(device);
  rows.learned = learned.to(device);
  return rows;
}

}  // namespace kuafu::chat

// Preference pairs for the reward model and DPO: JSONL lines of {"prompt", "chosen", "rejected"} and
// optionally "kind" (what is wrong with the rejected answer: "other", "shuffled", "cut", "loop", ...,
// reported separately), each answer rendered after the prompt as instruction fine-tuning renders it
// (core/io/instruction_data.h), so the models score exactly what the policy writes.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/io/instruction_data.h"

namespace kuafu::chat {

struct PreferencePair {
  io::InstructionExample chosen, rejected;  // prompt, answer and EOS; the answer and EOS learned
  int kind = 0;                             // index into PreferenceSet::kinds
};

struct PreferenceSet {
  std::vector<PreferencePair> pairs;
  std::vector<std::string> kinds;  // in order of first appearance; "" for pairs that name none
  int64_t skipped_too_long = 0;    // pairs with an answer longer than format.max_tokens
};

// kuafu::Error naming file:line for malformed JSON, a missing or empty field, or identical answers.
PreferenceSet read_preferences(const std::string& path, const io::BpeTokenizer& tokenizer, const io::InstructionFormat& format);

// Pairs as model rows: the n chosen answers, then the n rejected ones, right-padded with `pad_id` to the
// longest (a multiple of 8).
struct PairRows {
  torch::Tensor tokens;   // [2n, T]
  torch::Tensor real;     // [2n, T] bool
  torch::Tensor learned;  // [2n, T] bool: the answer's tokens and its EOS
  std::vector<int> kinds;     // [n]
  std::vector<size_t> pairs;  // [n]: their indices in the set
  int64_t count() const { return static_cast<int64_t>(pairs.size()); }
};
PairRows pair_rows(const PreferenceSet& set, const std::vector<size_t>& pairs, int64_t pad_id, const torch::Device& device);

}  // namespace kuafu::chat

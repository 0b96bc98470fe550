// Instruction examples for fine-tuning chat models (OPT and, next, RLHF's policy): JSONL lines of
// {"prompt": ..., "response": ...} or {"messages": [{"role": "system" | "user" | "assistant",
// "content": ...}, ...]} rendered with a plain chat template, tokenized with byte-level BPE. Each token
// carries whether the loss learns it: the responses (assistant turns) and the EOS after each, never the
// prompts, the template's prefixes, the BOS or padding. The flags are positional, so a tokenizer whose
// padding id is its EOS id still learns every real EOS.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/io/bpe_tokenizer.h"

namespace kuafu::io {

struct InstructionFormat {
  std::string prompt_end = "\n";  // between a prompt and its response
  std::string system_prefix = "System: ", user_prefix = "User: ", assistant_prefix = "Assistant: ";
  std::string turn_end = "\n";     // after a system or user turn
  std::optional<int64_t> bos;      // prepended once (OPT's "</s>"), unless the text already starts with it
  int64_t eos = 0;                 // after every response, learned
  int64_t max_tokens = 0;          // longer examples are skipped and counted; 0: no limit
};

struct InstructionExample {
  std::vector<int64_t> tokens;
  std::vector<uint8_t> learned;  // learned[i]: the loss predicts tokens[i] (from tokens[..i))
  int64_t learned_count() const;
};

struct InstructionSet {
  std::vector<InstructionExample> examples;
  int64_t skipped_too_long = 0;
};

// Segments of text in order, each learned or not, as one example (BOS first, EOS after each learned one).
InstructionExample make_example(const std::vector<std::pair<std::string, bool>>& segments, const BpeTokenizer& tokenizer,
                                const InstructionFormat& format);

// Each non-blank line of a JSONL file, parsed, with "path:line" for messages; kuafu::Error naming
// file:line for a line that is not JSON, and the file when it cannot be read.
void read_jsonl(const std::string& path, const std::function<void(const nlohmann::json& item, const std::string& where)>& each);
// object[key], a non-empty string; kuafu::Error naming `where` and the key otherwise.
std::string text_field(const nlohmann::json& object, const char* key, const std::string& where);

// One JSONL file; kuafu::Error naming file:line for malformed JSON, a missing or empty field, an
// unknown role, or a conversation with no assistant turn.
InstructionSet read_instructions(const std::string& path, const BpeTokenizer& tokenizer, const InstructionFormat& format);

}  // namespace kuafu::io

// Instruction examples for fine-tuning chat models (OPT, GPT-2, the Llama family; RLHF's policy): JSONL
// lines of {"prompt": ..., "response": ...} or {"messages": [{"role": "system" | "user" | "assistant",
// "content": ...}, ...]} rendered with the tokenizer folder's chat template (a prompt and response as one
// user and one assistant turn) or, without one, a plain framing; tokenized with byte-level BPE. Each token
// carries whether the loss learns it: the responses (assistant turns) and what closes each (the EOS, or
// the template's end of turn), never the prompts, the template's prefixes, the BOS or padding. The flags
// are positional, so a tokenizer whose padding id is its EOS id still learns every real EOS.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/io/bpe_tokenizer.h"
#include "core/io/chat_template.h"

namespace kuafu::io {

struct InstructionFormat {
  std::string prompt_end = "\n";  // between a prompt and its response
  std::string system_prefix = "System: ", user_prefix = "User: ", assistant_prefix = "Assistant: ";
  std::string turn_end = "\n";     // after a system or user turn
  std::optional<int64_t> bos;      // prepended once (OPT's "</s>"), unless the text already starts with it
  int64_t eos = 0;                 // after every response, learned
  int64_t max_tokens = 0;          // longer examples are skipped and counted; 0: no limit
  // The folder's chat template: conversations rendered by it instead of the plain framing above, whose
  // text then holds every special token (no BOS or EOS is added); `eos` is the token closing its
  // assistant turns (turn_end_token). Null: the plain framing.
  std::shared_ptr<const FolderTemplate> chat_template;
  // Other tokens that end a generated answer (generation_config.json's EOS ids: Qwen2.5's <|endoftext|>
  // beside its template's <|im_end|>); generation stops at them, training never learns them.
  std::vector<int64_t> also_stop;

  std::vector<int64_t> stop_tokens() const;  // eos, then also_stop's others
};

// The token a template closes an assistant turn with (what it renders right after an answer's text:
// Llama 3's <|eot_id|>, ChatML's <|im_end|>, Mistral's </s>), where generation stops; kuafu::Error when the
// template renders nothing after an answer.
int64_t turn_end_token(const FolderTemplate& folder, const BpeTokenizer& tokenizer);
// A prompt and its answer as an example's segments: the template's rendering of one user and one assistant
// turn, or the plain prompt + prompt_end then the answer (learned).
std::vector<std::pair<std::string, bool>> exchange_segments(const std::string& prompt, const std::string& answer,
                                                           const InstructionFormat& format, const std::string& where);
// A conversation so far ([user, assistant, ...] pairs of texts, then `message`) as the model sees it before
// answering `message`.
std::vector<int64_t> conversation_prompt_tokens(const std::vector<std::pair<std::string, std::string>>& turns,
                                                const std::string& message, const BpeTokenizer& tokenizer,
                                                const InstructionFormat& format);
// Frames `format` with the chat template of the tokenizer folder `dir` when it has one (its end of turn as
// EOS, no BOS of its own); returns whether it did. kuafu::Error for a template that cannot frame examples.
bool use_folder_template(InstructionFormat& format, const std::string& dir, const BpeTokenizer& tokenizer);
// A prompt as the model sees it before answering: the template's rendering of one user turn with the
// generation prompt, or the plain prompt + prompt_end; tokens with the BOS where the plain framing adds it.
std::vector<int64_t> prompt_tokens(const std::string& prompt, const BpeTokenizer& tokenizer, const InstructionFormat& format);

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

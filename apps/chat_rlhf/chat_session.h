// A conversation with a policy, as `kuafu-chat chat` holds it: the turns so far rendered as fine-tuning
// rendered conversations (each prompt, then its answer and EOS, after one BOS), the reply sampled with
// the KV cache and streamed in whole characters as it comes, and the oldest turns dropped (with a
// notice) when the conversation would not leave room for an answer within the model's context.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/causal_lm.h"
#include "core/io/bpe_tokenizer.h"
#include "core/io/instruction_data.h"
#include "core/nn/generation.h"

namespace kuafu::chat {

class ChatSession {
 public:
  ChatSession(nn::CausalLMPtr model, std::shared_ptr<const io::BpeTokenizer> tokenizer, io::InstructionFormat format,
              nn::SamplingOptions sampling);

  // The reply to `message` after the history: `stream` receives its text in whole characters as it is
  // generated, `notice` a line when old turns are dropped. `interrupted` (may be null) stops the reply
  // where it is (Ctrl-C); the turn then stays in the history as far as it got.
  std::string reply(const std::string& message, const std::function<void(const std::string&)>& stream,
                    const std::function<void(const std::string&)>& notice, const std::function<bool()>& interrupted = nullptr);
  void reset() { turns_.clear(); }
  // `/set NAME VALUE`: temperature, top_k, top_p, max_new_tokens, seed. kuafu::Error naming what is wrong.
  void set(const std::string& name, const std::string& value);

  const std::vector<std::pair<std::string, std::string>>& turns() const { return turns_; }
  const nn::SamplingOptions& sampling() const { return sampling_; }

 private:
  // The tokens of the turns from `first` on, then `message` awaiting its answer.
  std::vector<int64_t> render(size_t first, const std::string& message) const;

  nn::CausalLMPtr model_;
  std::shared_ptr<const io::BpeTokenizer> tokenizer_;
  io::InstructionFormat format_;
  nn::SamplingOptions sampling_;
  std::vector<std::pair<std::string, std::string>> turns_;  // (message, reply)
  int64_t replies_ = 0;  // each reply draws from its own seed (seed + replies) so a conversation replays
};

// Sets one sampling option by name: temperature, top_k, top_p, max_new_tokens, seed; kuafu::Error naming
// what is wrong.
void set_sampling_option(nn::SamplingOptions& sampling, const std::string& name, const std::string& value);

// `kuafu-chat chat --model DIR [--prompt TEXT] [--temperature T] [--top-k K] [--top-p P]
// [--max-new-tokens N] [--seed S]`: interactive on a terminal (/reset, /quit, /set NAME VALUE, Ctrl-C
// stops a reply, Ctrl-C at the prompt or end of input leaves); --prompt answers once and exits.
int run_chat(int argc, const char* const argv[]);

}  // namespace kuafu::chat

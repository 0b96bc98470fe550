// What the stages read besides their models: the tokenizer and chat template (as OPT fine-tuning renders
// examples), preference pairs and prompts, each file checked and named by its config key.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "apps/chat_rlhf/preference_data.h"
#include "apps/opt_finetune/app_config.h"
#include "core/config/config.h"
#include "core/train/model_recipe.h"

namespace kuafu::chat {

struct ChatText {
  std::shared_ptr<const io::BpeTokenizer> tokenizer;
  io::InstructionFormat format;  // BOS and EOS "</s>", longest example data.context
  int64_t pad_id = 0;            // "<pad>", else EOS (padding is positional: an EOS never hides)
  // A prompt's tokens as the policy sees it before answering.
  std::vector<int64_t> prompt_tokens(const std::string& prompt) const;
  std::string decode_answer(std::vector<int64_t> tokens) const;  // its EOS dropped, whole characters only
};
ChatText chat_text(const config::Config& config, const opt::OptData& data, const opt::LmShape& shape);

// kuafu::Error at `key` unless `model` (read from `folder`) reads the tokens `trained` does: the same
// family and vocabulary, and the folder's tokenizer is the run's `tokenizer` (data.tokenizer); `role`
// names the trained one in the message ("the actor", "the policy").
void check_same_tokens(const config::Config& config, const std::string& key, const std::string& folder, nn::CausalLM& model,
                       nn::CausalLM& trained, const std::string& role, const io::BpeTokenizer& tokenizer);

// The frozen reference of DPO and PPO/GRPO: the folder `key` names (dpo.reference, rl.reference), or
// model.init_from's (the SFT model the trained one starts from) when it is empty; `key` names whichever
// gave it. kuafu::Error at `key` when neither names one.
struct ReferenceFolder {
  std::string key;
  std::string folder;
};
ReferenceFolder reference_folder(const config::Config& config, const std::string& key, const std::string& value);
// Its recipe: a frozen model in its section models.reference, every weight from the folder.
train::ModelRecipe<nn::CausalLMPtr> reference_recipe(const ReferenceFolder& reference);

// The pairs of the file `path` (named by `key` in errors); kuafu::Error when missing or empty.
std::shared_ptr<const PreferenceSet> read_preference_file(const config::Config& config, const std::string& key,
                                                          const std::string& path, const ChatText& text);

struct Prompt {
  std::string text;
  std::vector<int64_t> tokens;
  std::string answer;  // the file's "answer", else its "response": the reference verifiable rewards and held-out scores read
};
// The prompts of a JSONL file ({"prompt": ...}, optionally "answer" or "response"), at most `limit` (0: all), those
// longer than data.context − `room` tokens skipped.
std::vector<Prompt> read_prompt_file(const config::Config& config, const std::string& key, const std::string& path,
                                     const ChatText& text, int64_t limit, int64_t room);

}  // namespace kuafu::chat

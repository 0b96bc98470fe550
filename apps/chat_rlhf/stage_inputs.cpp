#include "apps/chat_rlhf/stage_inputs.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>

#include "apps/opt_finetune/causal_lm_family.h"
#include "core/train/hf_interop.h"
#include "core/util/logging.h"
#include "core/util/utf8.h"

namespace kuafu::chat {
namespace fs = std::filesystem;

std::vector<int64_t> ChatText::prompt_tokens(const std::string& prompt) const {
  return io::prompt_tokens(prompt, *tokenizer, format);
}

std::string ChatText::decode_answer(std::vector<int64_t> tokens) const {
  if (!tokens.empty() && tokens.back() == format.eos) tokens.pop_back();
  return text::replace_invalid_utf8(tokenizer->decode(tokens));
}

ChatText chat_text(const config::Config& config, const opt::OptData& data, const opt::LmShape& shape) {
  ChatText text;
  auto tokenizer = std::make_shared<io::BpeTokenizer>(opt::load_tokenizer(config, data));
  text.format = opt::instruction_format(config, data, *tokenizer, shape);
  text.pad_id = tokenizer->token_id("<pad>").value_or(text.format.eos);
  text.tokenizer = tokenizer;
  return text;
}

ReferenceFolder reference_folder(const config::Config& config, const std::string& key, const std::string& value) {
  if (!value.empty()) return {key, value};
  const std::string folder = train::init_from(config);
  if (folder.empty()) config.fail_at(key, "is empty and so is model.init_from: name the SFT model (the frozen reference)");
  return {"model.init_from", folder};
}

train::ModelRecipe<nn::CausalLMPtr> reference_recipe(const ReferenceFolder& reference) {
  train::ModelRecipe<nn::CausalLMPtr> recipe = opt::causal_lm_folder_recipe(reference.folder, "reference");
  recipe.size_keys = {reference.key};
  return recipe;
}

void check_same_tokens(const config::Config& config, const std::string& key, const std::string& folder, nn::CausalLM& model,
                       nn::CausalLM& trained, const std::string& role, const io::BpeTokenizer& tokenizer) {
  if (model.family() != trained.family() || model.vocab_size() != trained.vocab_size()) {
    config.fail_at(key, "= " + folder + " is " + model.family() + " with a vocabulary of " + std::to_string(model.vocab_size()) +
                            " rows, " + role + " " + trained.family() + " with " + std::to_string(trained.vocab_size()) +
                            ": train it from the same SFT model");
  }
  // The same number of rows is not the same tokens: another tokenizer's ids would be read as other words.
  std::optional<io::BpeTokenizer> own;
  try {
    own.emplace(io::BpeTokenizer::from_folder(folder));
  } catch (const Error& e) {
    config.fail_at(key, "= " + folder + ": its tokenizer cannot be read (" + e.what() + "), so nothing shows that it reads " +
                            role + "'s tokens; copy the SFT model's tokenizer files into it");
  }
  if (!own->same_as(tokenizer)) {
    config.fail_at(key, "= " + folder + " has another tokenizer than data.tokenizer (vocabulary, merges or special tokens " +
                            "differ): it would read " + role + "'s ids as other text; train it from the same SFT model");
  }
}

namespace {

void check_file(const config::Config& config, const std::string& key, const std::string& path, const std::string& recipe) {
  if (!fs::is_regular_file(path)) config.fail_at(key, "= " + path + " does not exist (" + recipe + ")");
}

}  // namespace

std::shared_ptr<const PreferenceSet> read_preference_file(const config::Config& config, const std::string& key,
                                                          const std::string& path, const ChatText& text) {
  check_file(config, key, path, "preference pairs: data/preferences/build.py");
  auto set = std::make_shared<PreferenceSet>(read_preferences(path, *text.tokenizer, text.format));
  if (set->pairs.empty()) config.fail_at(key, "= " + path + " holds no pair of at most data.context tokens");
  log::infof(path, ": ", set->pairs.size(), " pairs; ", set->skipped_too_long, " longer than data.context skipped");
  return set;
}

std::vector<Prompt> read_prompt_file(const config::Config& config, const std::string& key, const std::string& path,
                                     const ChatText& text, int64_t limit, int64_t room) {
  check_file(config, key, path, "prompts: data/instructions/build.py");
  std::vector<Prompt> prompts;
  int64_t skipped = 0;
  io::read_jsonl(path, [&](const nlohmann::json& item, const std::string& where) {
    if (limit > 0 && static_cast<int64_t>(prompts.size()) >= limit) return;
    Prompt p{io::text_field(item, "prompt", where), {}, ""};
    if (item.contains("answer")) {
      p.answer = io::text_field(item, "answer", where);
    } else if (item.contains("response")) {
      p.answer = io::text_field(item, "response", where);
    }
    p.tokens = text.prompt_tokens(p.text);
    if (static_cast<int64_t>(p.tokens.size()) + room > text.format.max_tokens) {
      ++skipped;
      return;
    }
    prompts.push_back(std::move(p));
  });
  if (prompts.empty()) config.fail_at(key, "= " + path + " holds no prompt that leaves room for an answer within data.context");
  if (skipped > 0) log::infof(path, ": ", skipped, " prompts too long for data.context skipped");
  return prompts;
}

}  // namespace kuafu::chat

#include "apps/stable_diffusion/prompt_tokens.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/io/json_file.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::sd {

namespace fs = std::filesystem;

namespace {

// A special token as the tokenizer configs write it: "text" or {"content": "text", ...}; "" when absent.
std::string token_named(const nlohmann::json& config, const std::string& key) {
  if (!config.contains(key)) return "";
  const nlohmann::json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object()) return value.value("content", std::string());
  return "";
}

}  // namespace

PromptTokenizer PromptTokenizer::from_folder(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  KUAFU_CHECK(fs::exists(config_path), dir, " has no tokenizer_config.json (a CLIPTokenizer folder: vocab.json, merges.txt, "
              "tokenizer_config.json)");
  const nlohmann::json config = io::read_json_object(config_path.string());
  KUAFU_CHECK(text::starts_with(config.value("tokenizer_class", std::string()), "CLIPTokenizer"), config_path.string(),
              ": tokenizer_class \"", config.value("tokenizer_class", std::string()), "\" is not CLIPTokenizer");
  PromptTokenizer t;
  t.bpe_ = std::make_shared<io::BpeTokenizer>(io::BpeTokenizer::from_folder(dir));
  // special_tokens_map.json names the pad token where tokenizer_config.json does not.
  std::string pad = token_named(config, "pad_token");
  if (const fs::path map = fs::path(dir) / "special_tokens_map.json"; pad.empty() && fs::exists(map)) {
    pad = token_named(io::read_json_object(map.string()), "pad_token");
  }
  if (pad.empty()) pad = "<|endoftext|>";
  auto id = [&](const std::string& token) {
    const std::optional<int64_t> found = t.bpe_->token_id(token);
    KUAFU_CHECK(found, dir, ": the vocabulary has no \"", token, "\"");
    return *found;
  };
  t.bos_ = id("<|startoftext|>");
  t.eos_ = id("<|endoftext|>");
  t.pad_ = id(pad);
  if (config.contains("model_max_length") && config["model_max_length"].is_number_integer()) {
    t.max_length_ = config["model_max_length"].get<int64_t>();
  }
  KUAFU_CHECK(t.max_length_ >= 2 && t.max_length_ <= 4096, config_path.string(), ": model_max_length = ", t.max_length_,
              " is not a CLIP context (77)");
  return t;
}

namespace {

std::string ascii_lower(std::string text) {
  for (char& c : text) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return text;
}

}  // namespace

int64_t PromptTokenizer::vocab_size() const { return bpe_->vocab_size() + added_count_; }

std::vector<int64_t> PromptTokenizer::add_concept(const std::string& token, int64_t vectors) {
  KUAFU_CHECK(!token.empty() && token.find_first_of(" \t\n") == std::string::npos, "the textual-inversion token \"", token,
              "\" must be one word without spaces");
  KUAFU_CHECK(vectors >= 1, "the textual-inversion token \"", token, "\" needs at least one vector, got ", vectors);
  std::vector<std::string> names = {token};
  for (int64_t i = 1; i < vectors; ++i) names.push_back(token + "_" + std::to_string(i));
  std::vector<int64_t> ids;
  for (const std::string& name : names) {
    const std::string lower = ascii_lower(name);
    KUAFU_CHECK(!bpe_->token_id(name) && !bpe_->token_id(lower), "the textual-inversion token \"", name,
                "\" is already in the tokenizer's vocabulary: choose a new one (e.g. <", token, ">)");
    for (const AddedToken& known : added_) {
      KUAFU_CHECK(known.lower_text != lower, "the textual-inversion token \"", name, "\" was already added");
    }
    ids.push_back(vocab_size());
    ++added_count_;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    // The concept's own name reads as all its vectors; token_<i> as itself.
    added_.push_back({ascii_lower(names[i]), i == 0 ? ids : std::vector<int64_t>{ids[i]}});
  }
  return ids;
}

std::vector<int64_t> PromptTokenizer::word_ids(const std::string& prompt) const {
  if (added_.empty()) return bpe_->encode(prompt);
  const std::string lower = ascii_lower(prompt);  // the same byte offsets as the prompt
  std::vector<int64_t> ids;
  size_t piece_start = 0;
  for (size_t at = 0; at < lower.size();) {
    const AddedToken* longest = nullptr;
    for (const AddedToken& token : added_) {
      if (lower.compare(at, token.lower_text.size(), token.lower_text) == 0 &&
          (!longest || token.lower_text.size() > longest->lower_text.size())) {
        longest = &token;
      }
    }
    if (!longest) {
      ++at;
      continue;
    }
    const std::vector<int64_t> before = bpe_->encode(prompt.substr(piece_start, at - piece_start));
    ids.insert(ids.end(), before.begin(), before.end());
    ids.insert(ids.end(), longest->ids.begin(), longest->ids.end());
    at += longest->lower_text.size();
    piece_start = at;
  }
  const std::vector<int64_t> rest = bpe_->encode(prompt.substr(piece_start));
  ids.insert(ids.end(), rest.begin(), rest.end());
  return ids;
}

std::vector<int64_t> PromptTokenizer::encode(const std::string& prompt) const {
  std::vector<int64_t> words = word_ids(prompt);
  words.resize(std::min<size_t>(words.size(), static_cast<size_t>(max_length_ - 2)));  // truncation keeps BOS and EOS
  std::vector<int64_t> ids = {bos_};
  ids.insert(ids.end(), words.begin(), words.end());
  ids.push_back(eos_);
  ids.resize(static_cast<size_t>(max_length_), pad_);
  return ids;
}

torch::Tensor PromptTokenizer::encode(const std::vector<std::string>& prompts) const {
  torch::Tensor out = torch::empty({static_cast<int64_t>(prompts.size()), max_length_}, torch::kInt64);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int64_t> ids = encode(prompts[i]);
    out[static_cast<int64_t>(i)].copy_(torch::tensor(ids, torch::kInt64));
  }
  return out;
}

}  // namespace kuafu::sd

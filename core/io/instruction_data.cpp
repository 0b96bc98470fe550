#include "core/io/instruction_data.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::io {

std::vector<int64_t> InstructionFormat::stop_tokens() const {
  std::vector<int64_t> stops{eos};
  for (int64_t id : also_stop) {
    if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
  }
  return stops;
}

int64_t InstructionExample::learned_count() const {
  return std::count(learned.begin(), learned.end(), uint8_t{1});
}

InstructionExample make_example(const std::vector<std::pair<std::string, bool>>& segments, const BpeTokenizer& tokenizer,
                                const InstructionFormat& format) {
  InstructionExample example;
  auto push = [&](int64_t id, bool learned) {
    example.tokens.push_back(id);
    example.learned.push_back(learned ? 1 : 0);
  };
  for (size_t s = 0; s < segments.size(); ++s) {
    const auto& [text, learned] = segments[s];
    const std::vector<int64_t> ids = tokenizer.encode(text);
    const bool framed_here = !format.chat_template;  // a template's text holds its BOS and ends of turn
    // One BOS: the tokenizer's own, when the text starts with it, or the format's.
    if (framed_here && s == 0 && format.bos && (ids.empty() || ids.front() != *format.bos)) push(*format.bos, false);
    for (int64_t id : ids) push(id, learned);
    if (framed_here && learned) push(format.eos, true);  // the model learns where a response ends
  }
  return example;
}

void read_jsonl(const std::string& path, const std::function<void(const nlohmann::json& item, const std::string& where)>& each) {
  std::ifstream in(path);
  KUAFU_CHECK(in, "cannot read ", path);
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (text::trim(line).empty()) continue;
    const std::string where = path + ":" + std::to_string(number);
    nlohmann::json item;
    try {
      item = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(where + ": not valid JSON: " + e.what());
    }
    each(item, where);
  }
}

std::string text_field(const nlohmann::json& object, const char* key, const std::string& where) {
  KUAFU_CHECK(object.is_object() && object.contains(key) && object[key].is_string() && !object[key].get<std::string>().empty(),
              where, ": expected a non-empty string \"", key, "\"");
  return object[key].get<std::string>();
}

namespace {

// A conversation in the plain framing: each turn after its role's prefix, the assistant turns learned.
std::vector<std::pair<std::string, bool>> plain_segments(const nlohmann::ordered_json& messages, const InstructionFormat& format,
                                                         const std::string& where) {
  std::vector<std::pair<std::string, bool>> segments;
  for (const nlohmann::ordered_json& message : messages) {
    const std::string &role = message["role"].get_ref<const std::string&>(), &content = message["content"].get_ref<const std::string&>();
    if (role == "assistant") {
      segments.emplace_back(format.assistant_prefix, false);
      segments.emplace_back(content, true);
    } else if (role == "user" || role == "system") {
      segments.emplace_back((role == "user" ? format.user_prefix : format.system_prefix) + content + format.turn_end, false);
    } else {
      fail(where + ": unknown role \"" + text::abbreviate(role) + "\" (system, user or assistant)");
    }
  }
  return segments;
}

}  // namespace

InstructionSet read_instructions(const std::string& path, const BpeTokenizer& tokenizer, const InstructionFormat& format) {
  InstructionSet set;
  read_jsonl(path, [&](const nlohmann::json& item, const std::string& where) {
    auto text_of = [&](const nlohmann::json& object, const char* key) { return text_field(object, key, where); };
    std::vector<std::pair<std::string, bool>> segments;
    if (item.is_object() && item.contains("messages")) {
      KUAFU_CHECK(item["messages"].is_array() && !item["messages"].empty(), where, ": \"messages\" must be a non-empty list");
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      for (const nlohmann::json& message : item["messages"]) {
        messages.push_back({{"role", text_of(message, "role")}, {"content", text_of(message, "content")}});
      }
      segments = format.chat_template ? template_segments(*format.chat_template, messages, where)
                                      : plain_segments(messages, format, where);
    } else {
      segments = exchange_segments(text_of(item, "prompt"), text_of(item, "response"), format, where);
    }
    const bool answered = std::any_of(segments.begin(), segments.end(), [](const auto& segment) { return segment.second; });
    KUAFU_CHECK(answered, where, ": the conversation has no assistant turn to learn");
    InstructionExample example = make_example(segments, tokenizer, format);
    if (format.max_tokens > 0 && static_cast<int64_t>(example.tokens.size()) > format.max_tokens) {
      ++set.skipped_too_long;
      return;
    }
    set.examples.push_back(std::move(example));
  });
  return set;
}

int64_t turn_end_token(const FolderTemplate& folder, const BpeTokenizer& tokenizer) {
  // A one-letter answer: the first token the template renders after it closes the turn.
  const std::string answer = "x";
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", "?"}}, {{"role", "assistant"}, {"content", answer}}};
  const auto segments = template_segments(folder, messages, "the chat template");
  const std::string& turn = segments.back().first;
  const size_t at = turn.find(answer);
  KUAFU_CHECK(at != std::string::npos && at + answer.size() < turn.size(), "the chat template renders nothing after an answer, so "
              "nothing tells where an answer ends (rendered: \"", text::abbreviate(turn), "\")");
  const std::vector<int64_t> ids = tokenizer.encode(turn.substr(at + answer.size()));
  return ids.front();
}

std::vector<std::pair<std::string, bool>> exchange_segments(const std::string& prompt, const std::string& answer,
                                                           const InstructionFormat& format, const std::string& where) {
  if (!format.chat_template) return {{prompt + format.prompt_end, false}, {answer, true}};
  const nlohmann::ordered_json messages = {{{"role", "user"}, {"content", prompt}}, {{"role", "assistant"}, {"content", answer}}};
  return template_segments(*format.chat_template, messages, where);
}

std::vector<int64_t> conversation_prompt_tokens(const std::vector<std::pair<std::string, std::string>>& turns,
                                                const std::string& message, const BpeTokenizer& tokenizer,
                                                const InstructionFormat& format) {
  if (format.chat_template) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    for (const auto& [asked, answered] : turns) {
      messages.push_back({{"role", "user"}, {"content", asked}});
      messages.push_back({{"role", "assistant"}, {"content", answered}});
    }
    messages.push_back({{"role", "user"}, {"content", message}});
    return tokenizer.encode(template_prompt(*format.chat_template, messages));
  }
  std::vector<std::pair<std::string, bool>> segments;
  for (const auto& [asked, answered] : turns) {
    segments.emplace_back(asked + format.prompt_end, false);
    segments.emplace_back(answered, true);  // make_example closes it with EOS
  }
  segments.emplace_back(message + format.prompt_end, false);
  return make_example(segments, tokenizer, format).tokens;
}

bool use_folder_template(InstructionFormat& format, const std::string& dir, const BpeTokenizer& tokenizer) {
  std::optional<FolderTemplate> folder = read_folder_template(dir);
  if (!folder) return false;
  format.chat_template = std::make_shared<const FolderTemplate>(std::move(*folder));
  format.bos.reset();  // the template's text holds the BOS where it wants one
  format.eos = turn_end_token(*format.chat_template, tokenizer);
  return true;
}

std::vector<int64_t> prompt_tokens(const std::string& prompt, const BpeTokenizer& tokenizer, const InstructionFormat& format) {
  return conversation_prompt_tokens({}, prompt, tokenizer, format);
}

}  // namespace kuafu::io

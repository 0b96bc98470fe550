#include "core/io/instruction_data.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::io {

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
    // One BOS: the tokenizer's own, when the text starts with it, or the format's.
    if (s == 0 && format.bos && (ids.empty() || ids.front() != *format.bos)) push(*format.bos, false);
    for (int64_t id : ids) push(id, learned);
    if (learned) push(format.eos, true);  // the model learns where a response ends
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

InstructionSet read_instructions(const std::string& path, const BpeTokenizer& tokenizer, const InstructionFormat& format) {
  InstructionSet set;
  read_jsonl(path, [&](const nlohmann::json& item, const std::string& where) {
    auto text_of = [&](const nlohmann::json& object, const char* key) { return text_field(object, key, where); };
    std::vector<std::pair<std::string, bool>> segments;
    if (item.is_object() && item.contains("messages")) {
      KUAFU_CHECK(item["messages"].is_array() && !item["messages"].empty(), where, ": \"messages\" must be a non-empty list");
      bool answered = false;
      for (const nlohmann::json& message : item["messages"]) {
        const std::string role = text_of(message, "role"), content = text_of(message, "content");
        if (role == "assistant") {
          segments.emplace_back(format.assistant_prefix, false);
          segments.emplace_back(content, true);
          answered = true;
        } else if (role == "user" || role == "system") {
          segments.emplace_back((role == "user" ? format.user_prefix : format.system_prefix) + content + format.turn_end, false);
        } else {
          fail(where + ": unknown role \"" + text::abbreviate(role) + "\" (system, user or assistant)");
        }
      }
      KUAFU_CHECK(answered, where, ": the conversation has no assistant turn to learn");
    } else {
      segments.emplace_back(text_of(item, "prompt") + format.prompt_end, false);
      segments.emplace_back(text_of(item, "response"), true);
    }
    InstructionExample example = make_example(segments, tokenizer, format);
    if (format.max_tokens > 0 && static_cast<int64_t>(example.tokens.size()) > format.max_tokens) {
      ++set.skipped_too_long;
      return;
    }
    set.examples.push_back(std::move(example));
  });
  return set;
}

}  // namespace kuafu::io

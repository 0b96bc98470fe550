// Hugging Face chat templates (tokenizer_config.json's "chat_template") rendered in C++: the subset of
// Jinja they are written in, with the environment transformers' apply_chat_template renders them in
// (trim_blocks and lstrip_blocks, loop controls, `raise_exception`, `tojson` as Python's json.dumps,
// `strftime_now`). No C++ Jinja library is packaged in Debian, so this is written by hand: statements
// if/elif/else, for (over lists, strings and dict items, with `loop.*`, an `if` filter and break/continue),
// set (names and namespace attributes), generation blocks; expressions with Python's literals,
// operators, slicing, conditional expressions, string and dict methods, the filters and tests chat
// templates use. Anything else is refused, naming the template and line.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace kuafu::io {

class ChatTemplate {
 public:
  // kuafu::Error naming `where` (the file) and the line for a template outside the subset or malformed.
  static ChatTemplate parse(const std::string& source, const std::string& where);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // The text for `context`: messages ([{"role", "content"}, ...]), add_generation_prompt, bos_token,
  // eos_token and whatever else the template reads (tools, ...). kuafu::Error with the template's own
  // message for raise_exception, or naming the line of an expression that cannot be evaluated.
  std::string render(const nlohmann::ordered_json& context) const;

  struct Node;

 private:
  ChatTemplate(std::shared_ptr<const Node> root, std::string where);
  std::shared_ptr<const Node> root_;
  std::string where_;
};

}  // namespace kuafu::io

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
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// A tokenizer folder's template and the special tokens it renders with: chat_template.jinja (as
// transformers 5 saves it), else tokenizer_config.json's "chat_template" (a string, or a list whose entry
// named "default" is taken), with its bos_token and eos_token (strings or {"content": ...}); nullopt
// when the folder has none. kuafu::Error naming the file for one that does not parse.
struct FolderTemplate {
  std::shared_ptr<const ChatTemplate> chat_template;
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();  // bos_token, eos_token (as text)
};
std::optional<FolderTemplate> read_folder_template(const std::string& dir);

// A conversation (messages [{"role", "content"}, ...]) cut into the text the template renders, each piece
// learned or not: everything up to each assistant turn (with the generation prompt) not learned, what the
// turn itself adds (its content and whatever closes it) learned, the turns after the last answer not. Rendered prefix by prefix; kuafu::Error
// naming `where` when a longer conversation does not render as a continuation of a shorter one.
std::vector<std::pair<std::string, bool>> template_segments(const FolderTemplate& folder, const nlohmann::ordered_json& messages,
                                                            const std::string& where);
// The text before an answer to `messages` (the generation prompt after them).
std::string template_prompt(const FolderTemplate& folder, const nlohmann::ordered_json& messages);

}  // namespace kuafu::io

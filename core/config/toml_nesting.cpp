#include "core/config/toml_nesting.h"

#include <cctype>
#include <vector>

namespace kuafu::config {
namespace {

// Reads TOML text only for its shape (headers, keys, brackets, strings, comments) and finds the first
// place that nests deeper than kMaxNesting. Text that is not TOML is skipped: the parser reports it.
class NestingScan {
 public:
  explicit NestingScan(std::string_view text) : text_(text) {}

  std::optional<TooDeep> run() {
    while (i_ < text_.size() && !too_deep_) {
      const char c = text_[i_];
      if (c == '\n') {
        ++line_;
        ++i_;
        if (open_.empty()) expect_ = kStatement;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (i_ < text_.size() && text_[i_] != '\n') ++i_;
      } else if (expect_ == kStatement) {
        statement(c);
      } else if (expect_ == kKey) {
        key_in_inline_table(c);
      } else if (expect_ == kValue) {
        value(c);
      } else {
        after_value(c);
      }
    }
    return too_deep_;
  }

 private:
  enum Expect { kStatement, kKey, kValue, kAfterValue };
  // An open inline table or array, and the depth of what is directly inside it before any key parts.
  struct Open {
    char bracket;
    size_t inner;
  };

  static bool is_bare(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }
  static bool is_quote(char c) { return c == '"' || c == '\''; }
  bool at(char c) const { return i_ < text_.size() && text_[i_] == c; }

  void check(size_t depth) {
    if (depth > kMaxNesting && !too_deep_) too_deep_ = TooDeep{line_, depth};
  }

  void statement(char c) {
    if (c == '[') {
      table_header();
    } else if (is_bare(c) || is_quote(c)) {
      key(header_depth_);
    } else {
      ++i_;
    }
  }

  // [a.b] opens a table at depth 2; [[a.b]] one more, the new element of the array a.b.
  void table_header() {
    ++i_;
    const bool array = at('[');
    if (array) ++i_;
    header_depth_ = key_parts() + (array ? 1 : 0);
    check(header_depth_);
    skip_blanks();
    while (at(']')) ++i_;
  }

  // A dotted key, then "=": its value sits `parts` levels below `base`.
  void key(size_t base) {
    const size_t parts = key_parts();
    if (parts == 0) {
      ++i_;
      return;
    }
    value_depth_ = base + parts;
    check(value_depth_);
    skip_blanks();
    if (at('=')) ++i_;
    expect_ = kValue;
  }

  void key_in_inline_table(char c) {
    if (c == '}') {
      close();
    } else if (c == ',') {
      ++i_;
    } else {
      key(open_.back().inner);
    }
  }

  void value(char c) {
    if (c == '{') {
      open_.push_back({'{', value_depth_});
      ++i_;
      expect_ = kKey;
    } else if (c == '[') {
      open_.push_back({'[', value_depth_ + 1});
      check(value_depth_ + 1);
      ++value_depth_;
      ++i_;
    } else if (c == ']' || c == '}') {
      close();  // an empty array, or one with a trailing comma
    } else if (is_quote(c)) {
      skip_string(c);
      expect_ = kAfterValue;
    } else {
      const size_t start = i_;
      while (i_ < text_.size() && std::string_view(",]}# \t\r\n").find(text_[i_]) == std::string_view::npos) ++i_;
      if (i_ == start) ++i_;
      expect_ = kAfterValue;
    }
  }

  void after_value(char c) {
    if (c == ']' || c == '}') {
      close();
      return;
    }
    ++i_;
    if (c != ',' || open_.empty()) return;
    if (open_.back().bracket == '{') {
      expect_ = kKey;
    } else {
      value_depth_ = open_.back().inner;
      expect_ = kValue;
    }
  }

  void close() {
    if (!open_.empty()) open_.pop_back();
    ++i_;
    expect_ = kAfterValue;
  }

  // The parts of a dotted key (bare or quoted, blanks around the dots); 0 when none is here.
  size_t key_parts() {
    size_t parts = 0;
    while (true) {
      skip_blanks();
      const size_t start = i_;
      if (i_ < text_.size() && is_quote(text_[i_])) {
        skip_string(text_[i_]);
      } else {
        while (i_ < text_.size() && is_bare(text_[i_])) ++i_;
      }
      if (i_ == start) return parts;
      ++parts;
      skip_blanks();
      if (!at('.')) return parts;
      ++i_;
    }
  }

  void skip_blanks() {
    while (at(' ') || at('\t')) ++i_;
  }

  // A basic ("...", with escapes) or literal ('...') string, either on one line or multi-line (""" or ''').
  void skip_string(char quote) {
    const std::string_view triple = quote == '"' ? "\"\"\"" : "'''";
    const bool multi_line = text_.substr(i_, 3) == triple;
    i_ += multi_line ? 3 : 1;
    while (i_ < text_.size()) {
      const char c = text_[i_];
      if (c == '\\' && quote == '"') {
        if (i_ + 1 < text_.size() && text_[i_ + 1] == '\n') ++line_;
        i_ += 2;
      } else if (multi_line && text_.substr(i_, 3) == triple) {
        i_ += 3;
        for (int extra = 0; extra < 2 && at(quote); ++extra) ++i_;  // """a"""" ends with a quote inside
        return;
      } else if (!multi_line && (c == quote || c == '\n')) {
        if (c == quote) ++i_;
        return;
      } else {
        if (c == '\n') ++line_;
        ++i_;
      }
    }
  }

  std::string_view text_;
  size_t i_ = 0;
  uint32_t line_ = 1;
  Expect expect_ = kStatement;
  size_t header_depth_ = 0;
  size_t value_depth_ = 0;
  std::vector<Open> open_;
  std::optional<TooDeep> too_deep_;
};

}  // namespace

std::optional<TooDeep> find_too_deep(std::string_view text) { return NestingScan(text).run(); }

std::string nesting_problem(size_t depth) {
  return "nesting too deep: expected at most " + std::to_string(kMaxNesting) +
         " levels of tables, dotted keys, arrays and inline tables, found " + std::to_string(depth);
}

}  // namespace kuafu::config

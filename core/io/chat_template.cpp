#include "core/io/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "core/util/error.h"

namespace kuafu::io {

using Json = nlohmann::ordered_json;

// Named rather than anonymous: ChatTemplate::Node, a member of an exported class, holds its expressions.
namespace chat_template_detail {

// ---- values ---------------------------------------------------------------------------------------------

// A Jinja value: JSON data, undefined (a missing name or key), or a namespace (attributes `set` may change,
// shared by reference as Jinja's are).
struct Value {
  Json json;
  bool undefined = false;
  std::shared_ptr<Json> ns;

  static Value of(Json j) { return Value{std::move(j), false, nullptr}; }
  static Value missing() { return Value{Json(), true, nullptr}; }
  const Json& data() const { return ns ? *ns : json; }
};

bool truthy(const Value& v) {
  if (v.undefined) return false;
  if (v.ns) return true;
  const Json& j = v.json;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>() != 0;
  if (j.is_number()) return j.get<double>() != 0.0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();
  return !j.empty();
}

// Python's repr of a float: the shortest text that reads back, with ".0" on whole numbers.
std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, x);
    if (std::strtod(buffer, nullptr) == x) break;
  }
  std::string s = buffer;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// A string as json.dumps writes it with ensure_ascii=False.
void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char code[8];
          std::snprintf(code, sizeof(code), "\\u%04x", static_cast<unsigned char>(c));
          out += code;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// json.dumps(x, ensure_ascii=False, indent=indent) (indent < 0: none, ", " and ": " separators).
void python_json(const Json& j, int indent, int depth, std::string& out) {
  const auto newline = [&](int level) {
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  if (j.is_object() || j.is_array()) {
    const bool object = j.is_object();
    if (j.empty()) {
      out += object ? "{}" : "[]";
      return;
    }
    out += object ? '{' : '[';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += indent >= 0 ? "," : ", ";
      first = false;
      if (indent >= 0) newline(depth + 1);
      if (object) {
        json_string(it.key(), out);
        out += ": ";
      }
      python_json(*it, indent, depth + 1, out);
    }
    if (indent >= 0) newline(depth);
    out += object ? '}' : ']';
  } else if (j.is_string()) {
    json_string(j.get_ref<const std::string&>(), out);
  } else if (j.is_boolean()) {
    out += j.get<bool>() ? "true" : "false";
  } else if (j.is_null()) {
    out += "null";
  } else if (j.is_number_float()) {
    out += python_float(j.get<double>());
  } else {
    out += j.dump();  // an integer (strings never go through dump: it throws on invalid UTF-8)
  }
}

// Python's repr, as Jinja prints a list or dict.
void python_repr(const Json& j, std::string& out) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    out += quote;
    for (const char c : s) {
      if (c == quote || c == '\\') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    out += quote;
  } else if (j.is_array() || j.is_object()) {
    const bool object = j.is_object();
    out += object ? '{' : '[';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      if (object) {
        python_repr(Json(it.key()), out);
        out += ": ";
      }
      python_repr(*it, out);
    }
    out += object ? '}' : ']';
  } else if (j.is_boolean()) {
    out += j.get<bool>() ? "True" : "False";
  } else if (j.is_null()) {
    out += "None";
  } else if (j.is_number_float()) {
    out += python_float(j.get<double>());
  } else {
    out += j.dump();
  }
}

// What {{ v }} prints (Python's str).
std::string to_text(const Value& v) {
  if (v.undefined) return "";
  const Json& j = v.data();
  if (j.is_string()) return j.get<std::string>();
  std::string out;
  python_repr(j, out);
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// ASCII case as Python's str.upper/lower change it for the text chat templates hold (role names, keywords).
std::string cased(std::string s, bool upper) {
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A mapping's [key, value] pairs in order (dict.items(), |items, `for k, v in d`).
Json items_of(const Json& mapping) {
  Json items = Json::array();
  for (auto it = mapping.begin(); it != mapping.end(); ++it) items.push_back(Json::array({it.key(), *it}));
  return items;
}

std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const auto strip_it = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_space(c); };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end && strip_it(s[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip_it(s[end - 1])) --end;
  }
  return s.substr(begin, end - begin);
}

// ---- lexing the template into text, outputs and statements ---------------------------------------------

struct Segment {
  enum Kind { kText, kOutput, kStatement } kind;
  std::string body;
  int line;
};

std::vector<Segment> segments_of(const std::string& source, const std::string& where) {
  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false, trim_next = false;
  const auto count_lines = [](const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); };
  while (pos <= source.size()) {
    size_t open = source.find('{', pos);
    while (open != std::string::npos && open + 1 < source.size() && source[open + 1] != '{' && source[open + 1] != '%' &&
           source[open + 1] != '#') {
      open = source.find('{', open + 1);
    }
    if (open != std::string::npos && open + 1 >= source.size()) open = std::string::npos;
    std::string text = source.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    line += count_lines(text);
    if (strip_next) text = strip(text, nullptr, true, false);
    if (trim_next && !text.empty()) {  // trim_blocks: the first newline after a block tag
      if (text[0] == '\n') {
        text.erase(0, 1);
      } else if (text.size() > 1 && text[0] == '\r' && text[1] == '\n') {
        text.erase(0, 2);
      }
    }
    strip_next = trim_next = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Segment::kText, text, text_line});
      break;
    }
    const char type = source[open + 1];
    const std::string close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    size_t inner = open + 2;
    const char modifier = inner < source.size() ? source[inner] : '\0';
    if (modifier == '-' || modifier == '+') ++inner;
    // The tag's end outside its string literals ({{ '}}' }} prints two braces).
    size_t end = std::string::npos;
    char quote = 0;
    for (size_t i = inner; i + 1 < source.size() && type != '#'; ++i) {
      if (quote) {
        if (source[i] == '\\') {
          ++i;
        } else if (source[i] == quote) {
          quote = 0;
        }
      } else if (source[i] == '\'' || source[i] == '"') {
        quote = source[i];
      } else if (source.compare(i, 2, close) == 0) {
        end = i;
        break;
      }
    }
    if (type == '#') end = source.find(close, inner);
    KUAFU_CHECK(end != std::string::npos, where, ":", line, ": a '{", type, "' is never closed by '", close, "'");
    std::string body = source.substr(inner, end - inner);
    const bool right_minus = !body.empty() && body.back() == '-';
    const bool right_plus = !body.empty() && body.back() == '+';
    if (right_minus || right_plus) body.pop_back();
    if (modifier == '-') {
      text = strip(text, nullptr, false, true);
    } else if (modifier != '+' && type != '{') {
      // lstrip_blocks: spaces and tabs from the start of the line (in the source) up to a block or comment tag.
      size_t k = open;
      while (k > pos && (source[k - 1] == ' ' || source[k - 1] == '\t')) --k;
      if (k == 0 || source[k - 1] == '\n') text.erase(text.size() - std::min(text.size(), open - k));
    }
    if (!text.empty()) out.push_back({Segment::kText, text, text_line});
    if (type != '#') out.push_back({type == '{' ? Segment::kOutput : Segment::kStatement, body, line});
    line += count_lines(source.substr(open, end + 2 - open));
    strip_next = right_minus;
    trim_next = type != '{' && !right_plus && !right_minus;
    pos = end + 2;
  }
  return out;
}

// ---- expressions ----------------------------------------------------------------------------------------

struct Token {
  enum Kind { kName, kNumber, kString, kOperator, kEnd } kind;
  std::string text;
  Json value;
};

std::vector<Token> tokens_of(const std::string& s, const std::string& where, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::kName, s.substr(i, j - i), Json()});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool real = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || (s[j] == '.' && !real && j + 1 < s.size() &&
                                                                                 std::isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        real |= s[j] == '.';
        ++j;
      }
      const std::string digits = s.substr(i, j - i);
      // A literal past int64 (or a double's range) is named, not left to std::stoll's exception (found by
      // fuzz_chat_template: fuzz/corpus/chat_template/crash-integer-past-int64).
      Json value;
      try {
        value = real ? Json(std::stod(digits)) : Json(std::stoll(digits));
      } catch (const std::exception&) {
        throw Error(where + ":" + std::to_string(line) + ": the number " + digits.substr(0, 40) + " is out of range");
      }
      out.push_back({Token::kNumber, digits, value});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          value += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          value += s[j];
        }
      }
      KUAFU_CHECK(j < s.size(), where, ":", line, ": a string is never closed");
      out.push_back({Token::kString, value, Json(value)});
      i = j + 1;
    } else {
      static const char* const kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
      std::string op(1, c);
      for (const char* two : kTwo) {
        if (s.compare(i, 2, two) == 0) op = two;
      }
      KUAFU_CHECK(std::string("+-*/%~<>()[]{}.,:|=!").find(c) != std::string::npos, where, ":", line, ": '", c,
                  "' is not part of the Jinja subset chat templates use");
      out.push_back({Token::kOperator, op, Json()});
      i += op.size();
    }
  }
  out.push_back({Token::kEnd, "", Json()});
  return out;
}

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum Kind { kLiteral, kName, kAttr, kIndex, kSlice, kCall, kFilter, kTest, kNot, kNegate, kBinary, kConditional, kList, kDict } kind;
  std::string name;  // name, attribute, filter, test, operator
  Json literal;      // literal; a test's negation (true)
  std::vector<ExprPtr> args;  // operands (a call's callee first; a slice's object then start, stop, step)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  int line = 0;
};

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, std::string where, int line)
      : tokens_(std::move(tokens)), where_(std::move(where)), line_(line) {}

  ExprPtr expression() { return conditional(); }
  // An expression that leaves a trailing `if` alone (a for loop's filter: `for x in xs if x.keep`).
  ExprPtr expression_before_if() {
    allow_if_ = false;
    ExprPtr e = logical_or();
    allow_if_ = true;
    return e;
  }
  bool at_end() const { return peek().kind == Token::kEnd; }
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  bool accept(const std::string& text) {
    const Token& t = peek();
    if (t.kind != Token::kString && t.kind != Token::kEnd && t.text == text) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(const std::string& text) {
    KUAFU_CHECK(accept(text), where_, ":", line_, ": expected '", text, "', found '", peek().text, "'");
  }
  std::string name() {
    KUAFU_CHECK(peek().kind == Token::kName, where_, ":", line_, ": expected a name, found '", peek().text, "'");
    return tokens_[pos_++].text;
  }
  [[noreturn]] void fail(const std::string& what) const { throw Error(where_ + ":" + std::to_string(line_) + ": " + what); }

 private:
  // Nesting deeper than any template needs is refused rather than left to exhaust the stack.
  static constexpr int kMaxDepth = 200;
  struct Deeper {
    explicit Deeper(ExprParser& p) : p(p) {
      if (++p.depth_ > kMaxDepth) p.fail("expressions nest deeper than " + std::to_string(kMaxDepth));
    }
    ~Deeper() { --p.depth_; }
    ExprParser& p;
  };
  ExprPtr make(Expr::Kind kind, std::string name, std::vector<ExprPtr> args, Json literal = Json()) const {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->name = std::move(name);
    e->args = std::move(args);
    e->literal = std::move(literal);
    e->line = line_;
    return e;
  }
  ExprPtr conditional() {
    const Deeper deeper(*this);
    ExprPtr value = logical_or();
    if (allow_if_ && peek().kind == Token::kName && peek().text == "if") {
      ++pos_;
      ExprPtr condition = logical_or();
      // Without an else: undefined (no name is empty), which prints nothing.
      ExprPtr otherwise = accept("else") ? conditional() : make(Expr::kName, "", {});
      return make(Expr::kConditional, "", {condition, value, otherwise});
    }
    return value;
  }
  ExprPtr logical_or() {
    ExprPtr left = logical_and();
    while (accept("or")) left = make(Expr::kBinary, "or", {left, logical_and()});
    return left;
  }
  ExprPtr logical_and() {
    ExprPtr left = logical_not();
    while (accept("and")) left = make(Expr::kBinary, "and", {left, logical_not()});
    return left;
  }
  ExprPtr logical_not() {
    const Deeper deeper(*this);
    if (accept("not")) return make(Expr::kNot, "", {logical_not()});
    return comparison();
  }
  ExprPtr comparison() {
    ExprPtr left = concatenation();
    for (;;) {
      std::string op;
      for (const char* candidate : {"==", "!=", "<=", ">=", "<", ">", "in"}) {
        if (accept(candidate)) {
          op = candidate;
          break;
        }
      }
      if (op.empty() && peek().text == "not" && peek(1).text == "in") {
        pos_ += 2;
        op = "not in";
      }
      if (op.empty()) return left;
      left = make(Expr::kBinary, op, {left, concatenation()});
    }
  }
  ExprPtr concatenation() {
    ExprPtr left = additive();
    while (accept("~")) left = make(Expr::kBinary, "~", {left, additive()});
    return left;
  }
  ExprPtr additive() {
    ExprPtr left = multiplicative();
    for (;;) {
      if (accept("+")) {
        left = make(Expr::kBinary, "+", {left, multiplicative()});
      } else if (accept("-")) {
        left = make(Expr::kBinary, "-", {left, multiplicative()});
      } else {
        return left;
      }
    }
  }
  ExprPtr multiplicative() {
    ExprPtr left = unary();
    for (;;) {
      std::string op;
      for (const char* candidate : {"//", "*", "/", "%"}) {
        if (accept(candidate)) {
          op = candidate;
          break;
        }
      }
      if (op.empty()) return left;
      left = make(Expr::kBinary, op, {left, unary()});
    }
  }
  ExprPtr unary() {
    const Deeper deeper(*this);
    if (accept("-")) return make(Expr::kNegate, "", {unary()});
    return postfix(primary());
  }
  void call_arguments(Expr& e) {
    if (accept(")")) return;
    do {
      if (peek().kind == Token::kName && peek(1).text == "=" ) {
        const std::string key = name();
        expect("=");
        e.kwargs.emplace_back(key, expression());
      } else {
        e.args.push_back(expression());
      }
    } while (accept(","));
    expect(")");
  }
  ExprPtr postfix(ExprPtr value) {
    for (;;) {
      if (accept(".")) {
        value = make(Expr::kAttr, name(), {value});
      } else if (accept("[")) {
        std::vector<ExprPtr> parts = {value};
        bool slice = false;
        for (int part = 0; part < 3; ++part) {
          if (peek().text == ":" || peek().text == "]") {
            parts.push_back(nullptr);
          } else {
            parts.push_back(expression());
          }
          if (!accept(":")) break;
          slice = true;
        }
        expect("]");
        value = slice ? make(Expr::kSlice, "", parts) : make(Expr::kIndex, "", {parts[0], parts[1]});
      } else if (accept("(")) {
        auto call = std::make_shared<Expr>();
        call->kind = Expr::kCall;
        call->args = {value};
        call->line = line_;
        call_arguments(*call);
        value = call;
      } else if (accept("|")) {
        auto filter = std::make_shared<Expr>();
        filter->kind = Expr::kFilter;
        filter->name = name();
        filter->args = {value};
        filter->line = line_;
        if (accept("(")) call_arguments(*filter);
        value = filter;
      } else if (peek().kind == Token::kName && peek().text == "is") {
        ++pos_;
        const bool negated = accept("not");
        auto test = std::make_shared<Expr>();
        test->kind = Expr::kTest;
        test->name = name();
        test->literal = negated;
        test->args = {value};
        test->line = line_;
        if (accept("(")) call_arguments(*test);
        value = test;
      } else {
        return value;
      }
    }
  }
  ExprPtr primary() {
    const Token t = peek();
    if (t.kind == Token::kNumber || t.kind == Token::kString) {
      ++pos_;
      Json value = t.value;
      while (t.kind == Token::kString && peek().kind == Token::kString) value = value.get<std::string>() + tokens_[pos_++].text;
      return make(Expr::kLiteral, "", {}, value);
    }
    if (t.kind == Token::kName) {
      ++pos_;
      if (t.text == "true" || t.text == "True") return make(Expr::kLiteral, "", {}, true);
      if (t.text == "false" || t.text == "False") return make(Expr::kLiteral, "", {}, false);
      if (t.text == "none" || t.text == "None") return make(Expr::kLiteral, "", {}, nullptr);
      return make(Expr::kName, t.text, {});
    }
    if (accept("(")) {
      ExprPtr inner = expression();
      expect(")");
      return inner;
    }
    if (accept("[")) {
      std::vector<ExprPtr> items;
      if (!accept("]")) {
        do {
          if (peek().text == "]") break;
          items.push_back(expression());
        } while (accept(","));
        expect("]");
      }
      return make(Expr::kList, "", items);
    }
    if (accept("{")) {
      std::vector<ExprPtr> items;  // key, value, key, value, ...
      if (!accept("}")) {
        do {
          if (peek().text == "}") break;
          items.push_back(expression());
          expect(":");
          items.push_back(expression());
        } while (accept(","));
        expect("}");
      }
      return make(Expr::kDict, "", items);
    }
    fail("expected a value, found '" + t.text + "'");
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::string where_;
  int line_;
  bool allow_if_ = true;
  int depth_ = 0;
};

}  // namespace chat_template_detail

using namespace chat_template_detail;  // NOLINT: this file's own helpers

// ---- statements -----------------------------------------------------------------------------------------

struct ChatTemplate::Node {
  enum Kind { kText, kOutput, kIf, kFor, kSet, kBreak, kContinue, kSequence } kind;
  std::string text;                        // text
  ExprPtr expr;                            // output, set's value, for's iterable
  std::vector<std::string> targets;        // for's loop variables; set's name (and attribute)
  ExprPtr filter;                          // for's `if`
  std::vector<std::pair<ExprPtr, std::shared_ptr<Node>>> branches;  // if's conditions and bodies
  std::shared_ptr<Node> body, otherwise;   // for's body and else; if's else
  std::vector<std::shared_ptr<Node>> children;  // a sequence
  int line = 0;
};

namespace {

using Node = ChatTemplate::Node;
using NodePtr = std::shared_ptr<Node>;

class StatementParser {
 public:
  StatementParser(std::vector<Segment> segments, std::string where) : segments_(std::move(segments)), where_(std::move(where)) {}

  // Statements until one of `ends` (its keyword returned in `stopped_at`, its parser positioned after the keyword).
  NodePtr sequence(const std::vector<std::string>& ends, std::string* stopped_at, std::unique_ptr<ExprParser>* rest) {
    constexpr int kMaxDepth = 100;  // blocks within blocks; deeper is refused rather than left to the stack
    KUAFU_CHECK(++depth_ <= kMaxDepth, where_, ": blocks nest deeper than ", kMaxDepth);
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{depth_};
    auto node = std::make_shared<Node>();
    node->kind = Node::kSequence;
    while (pos_ < segments_.size()) {
      const Segment& s = segments_[pos_++];
      if (s.kind == Segment::kText) {
        auto text = std::make_shared<Node>();
        text->kind = Node::kText;
        text->text = s.body;
        node->children.push_back(text);
        continue;
      }
      auto parser = std::make_unique<ExprParser>(tokens_of(s.body, where_, s.line), where_, s.line);
      if (s.kind == Segment::kOutput) {
        auto output = std::make_shared<Node>();
        output->kind = Node::kOutput;
        output->expr = parser->expression();
        output->line = s.line;
        KUAFU_CHECK(parser->at_end(), where_, ":", s.line, ": unexpected '", parser->peek().text, "' in {{ }}");
        node->children.push_back(output);
        continue;
      }
      const std::string keyword = parser->name();
      if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
        *stopped_at = keyword;
        *rest = std::move(parser);
        return node;
      }
      node->children.push_back(statement(keyword, *parser, s.line));
    }
    KUAFU_CHECK(ends.empty(), where_, ": the template ends before {% ", ends.back(), " %}");
    return node;
  }

 private:
  NodePtr statement(const std::string& keyword, ExprParser& p, int line) {
    auto node = std::make_shared<Node>();
    node->line = line;
    std::string stopped;
    std::unique_ptr<ExprParser> rest;
    if (keyword == "if") {
      node->kind = Node::kIf;
      ExprPtr condition = p.expression();
      for (;;) {
        NodePtr body = sequence({"elif", "else", "endif"}, &stopped, &rest);
        node->branches.emplace_back(condition, body);
        if (stopped == "elif") {
          condition = rest->expression();
          KUAFU_CHECK(rest->at_end(), where_, ": unexpected '", rest->peek().text, "' in {% elif %}");
          continue;
        }
        if (stopped == "else") node->otherwise = sequence({"endif"}, &stopped, &rest);
        break;
      }
    } else if (keyword == "for") {
      node->kind = Node::kFor;
      node->targets.push_back(p.name());
      while (p.accept(",")) node->targets.push_back(p.name());
      p.expect("in");
      node->expr = p.expression_before_if();
      if (p.accept("if")) node->filter = p.expression();
      node->body = sequence({"else", "endfor"}, &stopped, &rest);
      if (stopped == "else") node->otherwise = sequence({"endfor"}, &stopped, &rest);
    } else if (keyword == "set") {
      node->kind = Node::kSet;
      node->targets.push_back(p.name());
      if (p.accept(".")) node->targets.push_back(p.name());
      p.expect("=");
      node->expr = p.expression();
    } else if (keyword == "break" || keyword == "continue") {
      node->kind = keyword == "break" ? Node::kBreak : Node::kContinue;
    } else if (keyword == "generation") {  // transformers' assistant-mask marker: its body, as is
      node = sequence({"endgeneration"}, &stopped, &rest);
    } else {
      p.fail("{% " + keyword + " %} is not part of the Jinja subset chat templates use (if, for, set, break, continue, "
             "generation)");
    }
    KUAFU_CHECK(p.at_end() && (!rest || rest->at_end()), where_, ":", line, ": unexpected '",
                (p.at_end() ? rest->peek().text : p.peek().text), "' in {% ", keyword, " %}");
    return node;
  }

  std::vector<Segment> segments_;
  size_t pos_ = 0;
  std::string where_;
  int depth_ = 0;
};

// ---- evaluation -----------------------------------------------------------------------------------------

struct LoopSignal {
  bool is_break;
};

class Renderer {
 public:
  Renderer(const Json& context, const std::string& where) : where_(where) {
    scopes_.emplace_back();
    for (auto it = context.begin(); it != context.end(); ++it) scopes_.back()[it.key()] = Value::of(*it);
  }

  void run(const Node& node, std::string& out) {
    switch (node.kind) {
      case Node::kText: out += node.text; return;
      case Node::kOutput: out += to_text(eval(*node.expr)); return;
      case Node::kSequence:
        for (const auto& child : node.children) run(*child, out);
        return;
      case Node::kIf:
        for (const auto& [condition, body] : node.branches) {
          if (truthy(eval(*condition))) {
            run(*body, out);
            return;
          }
        }
        if (node.otherwise) run(*node.otherwise, out);
        return;
      case Node::kSet: {
        Value value = eval(*node.expr);
        if (node.targets.size() == 2) {
          Value* target = lookup(node.targets[0]);
          if (!target || !target->ns) fail(node.line, "{% set " + node.targets[0] + "." + node.targets[1] + " %} needs a namespace()");
          (*target->ns)[node.targets[1]] = value.data();
        } else {
          scopes_.back()[node.targets[0]] = value;
        }
        return;
      }
      case Node::kBreak: throw LoopSignal{true};
      case Node::kContinue: throw LoopSignal{false};
      case Node::kFor: run_for(node, out); return;
    }
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const { throw Error(where_ + ":" + std::to_string(line) + ": " + what); }

  Value* lookup(const std::string& name) {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      const auto found = scope->find(name);
      if (found != scope->end()) return &found->second;
    }
    return nullptr;
  }

  void run_for(const Node& node, std::string& out) {
    const Value iterable = eval(*node.expr);
    std::vector<Json> items;
    const Json& data = iterable.data();
    if (!iterable.undefined) {
      if (data.is_array()) {
        items.assign(data.begin(), data.end());
      } else if (data.is_object()) {
        for (const Json& pair : items_of(data)) items.push_back(node.targets.size() == 2 ? pair : pair[0]);
      } else if (data.is_string()) {
        for (const char c : data.get<std::string>()) items.push_back(std::string(1, c));
      } else if (!data.is_null()) {
        fail(node.line, "cannot loop over " + to_text(iterable));
      }
    }
    std::vector<Json> kept;
    scopes_.emplace_back();
    for (const Json& item : items) {
      bind(node, item);
      if (!node.filter || truthy(eval(*node.filter))) kept.push_back(item);
    }
    const auto n = static_cast<int64_t>(kept.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.back().clear();
      bind(node, kept[static_cast<size_t>(i)]);
      Json loop = {{"index", i + 1}, {"index0", i}, {"revindex", n - i}, {"revindex0", n - i - 1}, {"first", i == 0},
                   {"last", i == n - 1}, {"length", n}};
      loop["previtem"] = i > 0 ? kept[static_cast<size_t>(i - 1)] : Json();
      loop["nextitem"] = i + 1 < n ? kept[static_cast<size_t>(i + 1)] : Json();
      scopes_.back()["loop"] = Value::of(loop);
      try {
        run(*node.body, out);
      } catch (const LoopSignal& signal) {
        if (signal.is_break) break;
      }
    }
    scopes_.pop_back();
    if (n == 0 && node.otherwise) run(*node.otherwise, out);
  }

  void bind(const Node& node, const Json& item) {
    if (node.targets.size() == 1) {
      scopes_.back()[node.targets[0]] = Value::of(item);
      return;
    }
    if (!item.is_array() || item.size() != node.targets.size()) fail(node.line, "cannot unpack " + to_text(Value::of(item)) + " into the loop's names");
    for (size_t k = 0; k < node.targets.size(); ++k) scopes_.back()[node.targets[k]] = Value::of(item[k]);
  }

  static int64_t as_int(const Value& v) { return v.data().is_number() ? v.data().get<int64_t>() : 0; }

  static Json sliced(const Json& data, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step) {
    const auto n = static_cast<int64_t>(data.is_string() ? data.get_ref<const std::string&>().size() : data.size());
    const auto clamp_index = [&](int64_t i, int64_t low, int64_t high) { return std::min(std::max(i < 0 ? i + n : i, low), high); };
    int64_t first = step > 0 ? clamp_index(start.value_or(0), 0, n) : clamp_index(start.value_or(n - 1), -1, n - 1);
    const int64_t last = step > 0 ? clamp_index(stop.value_or(n), 0, n) : (stop ? clamp_index(*stop, -1, n - 1) : -1);
    if (data.is_string()) {
      std::string out;
      for (int64_t i = first; step > 0 ? i < last : i > last; i += step) out += data.get_ref<const std::string&>()[static_cast<size_t>(i)];
      return out;
    }
    Json out = Json::array();
    for (int64_t i = first; step > 0 ? i < last : i > last; i += step) out.push_back(data[static_cast<size_t>(i)]);
    return out;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral: return Value::of(e.literal);
      case Expr::kName: {
        if (Value* v = lookup(e.name)) return *v;
        return Value::missing();
      }
      case Expr::kAttr: return member(eval(*e.args[0]), Json(e.name));
      case Expr::kIndex: return member(eval(*e.args[0]), eval(*e.args[1]).data());
      case Expr::kSlice: {
        const Value object = eval(*e.args[0]);
        const auto bound = [&](size_t k) -> std::optional<int64_t> {
          if (k >= e.args.size() || !e.args[k]) return std::nullopt;
          return as_int(eval(*e.args[k]));
        };
        const int64_t step = bound(3).value_or(1);
        if (step == 0) fail(e.line, "a slice step cannot be zero");
        if (!object.data().is_array() && !object.data().is_string()) fail(e.line, "cannot slice " + to_text(object));
        return Value::of(sliced(object.data(), bound(1), bound(2), step));
      }
      case Expr::kNot: return Value::of(!truthy(eval(*e.args[0])));
      case Expr::kNegate: {
        const Json v = eval(*e.args[0]).data();
        if (v.is_number_integer()) return Value::of(-v.get<int64_t>());
        if (v.is_number()) return Value::of(-v.get<double>());
        fail(e.line, "cannot negate " + to_text(Value::of(v)));
      }
      case Expr::kConditional:
        return truthy(eval(*e.args[0])) ? eval(*e.args[1]) : eval(*e.args[2]);
      case Expr::kList: {
        Json list = Json::array();
        for (const auto& item : e.args) list.push_back(eval(*item).data());
        return Value::of(list);
      }
      case Expr::kDict: {
        Json dict = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) dict[to_text(eval(*e.args[i]))] = eval(*e.args[i + 1]).data();
        return Value::of(dict);
      }
      case Expr::kBinary: return binary(e);
      case Expr::kCall: return call(e);
      case Expr::kFilter: return filter(e);
      case Expr::kTest: {
        const bool result = test(e);
        return Value::of(e.literal.get<bool>() ? !result : result);
      }
    }
    fail(e.line, "an expression Kuafu cannot evaluate");
  }

  Value member(const Value& object, const Json& key) {
    if (object.undefined) return Value::missing();
    const Json& data = object.data();
    if (data.is_object() && key.is_string()) {
      const auto found = data.find(key.get<std::string>());
      return found == data.end() ? Value::missing() : Value::of(*found);
    }
    if ((data.is_array() || data.is_string()) && key.is_number_integer()) {
      const auto n = static_cast<int64_t>(data.is_string() ? data.get_ref<const std::string&>().size() : data.size());
      int64_t i = key.get<int64_t>();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::missing();
      if (data.is_string()) return Value::of(std::string(1, data.get_ref<const std::string&>()[static_cast<size_t>(i)]));
      return Value::of(data[static_cast<size_t>(i)]);
    }
    return Value::missing();
  }

  static bool equal(const Json& a, const Json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    return a == b;
  }

  Value binary(const Expr& e) {
    if (e.name == "and") {
      const Value left = eval(*e.args[0]);
      return truthy(left) ? eval(*e.args[1]) : left;
    }
    if (e.name == "or") {
      const Value left = eval(*e.args[0]);
      return truthy(left) ? left : eval(*e.args[1]);
    }
    const Value lv = eval(*e.args[0]), rv = eval(*e.args[1]);
    const Json &a = lv.data(), &b = rv.data();
    if (e.name == "~") return Value::of(to_text(lv) + to_text(rv));
    if (e.name == "==") return Value::of(equal(a, b) && lv.undefined == rv.undefined);
    if (e.name == "!=") return Value::of(!(equal(a, b) && lv.undefined == rv.undefined));
    if (e.name == "in" || e.name == "not in") {
      bool found = false;
      if (b.is_string() && a.is_string()) {
        found = b.get<std::string>().find(a.get<std::string>()) != std::string::npos;
      } else if (b.is_array()) {
        found = std::any_of(b.begin(), b.end(), [&](const Json& item) { return equal(item, a); });
      } else if (b.is_object() && a.is_string()) {
        found = b.contains(a.get<std::string>());
      } else if (!rv.undefined && !b.is_null()) {
        fail(e.line, "'in' needs a string, list or mapping on its right, found " + to_text(rv));
      }
      return Value::of(e.name == "in" ? found : !found);
    }
    if (e.name == "+" && a.is_string() && b.is_string()) return Value::of(a.get<std::string>() + b.get<std::string>());
    if (e.name == "+" && a.is_array() && b.is_array()) {
      Json joined = a;
      for (const Json& item : b) joined.push_back(item);
      return Value::of(joined);
    }
    if (a.is_string() && b.is_string()) {
      const std::string &x = a.get_ref<const std::string&>(), &y = b.get_ref<const std::string&>();
      if (e.name == "<") return Value::of(x < y);
      if (e.name == ">") return Value::of(x > y);
      if (e.name == "<=") return Value::of(x <= y);
      if (e.name == ">=") return Value::of(x >= y);
    }
    if (!a.is_number() || !b.is_number()) fail(e.line, "'" + e.name + "' needs numbers, found " + to_text(lv) + " and " + to_text(rv));
    const bool integers = a.is_number_integer() && b.is_number_integer();
    const double x = a.get<double>(), y = b.get<double>();
    if (e.name == "<") return Value::of(x < y);
    if (e.name == ">") return Value::of(x > y);
    if (e.name == "<=") return Value::of(x <= y);
    if (e.name == ">=") return Value::of(x >= y);
    if (e.name == "/") return Value::of(x / y);
    if (integers) {
      const int64_t i = a.get<int64_t>(), j = b.get<int64_t>();
      if (e.name == "+") return Value::of(i + j);
      if (e.name == "-") return Value::of(i - j);
      if (e.name == "*") return Value::of(i * j);
      if ((e.name == "//" || e.name == "%") && j == 0) fail(e.line, "division by zero");
      const int64_t floor = i / j - ((i % j != 0 && ((i < 0) != (j < 0))) ? 1 : 0);
      if (e.name == "//") return Value::of(floor);
      if (e.name == "%") return Value::of(i - floor * j);
    }
    if (e.name == "+") return Value::of(x + y);
    if (e.name == "-") return Value::of(x - y);
    if (e.name == "*") return Value::of(x * y);
    if (e.name == "//") return Value::of(std::floor(x / y));
    if (e.name == "%") return Value::of(x - std::floor(x / y) * y);
    fail(e.line, "operator '" + e.name + "' is not part of the subset");
  }

  std::vector<Value> arguments(const Expr& e) {
    std::vector<Value> out;
    for (size_t i = 1; i < e.args.size(); ++i) out.push_back(eval(*e.args[i]));
    return out;
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    const std::vector<Value> args = arguments(e);
    const auto arg_text = [&](size_t i) { return i < args.size() ? to_text(args[i]) : std::string(); };
    if (callee.kind == Expr::kName) {
      if (callee.name == "raise_exception") throw Error(arg_text(0));
      if (callee.name == "namespace") {
        Value ns;
        ns.ns = std::make_shared<Json>(Json::object());
        for (const auto& [key, value] : e.kwargs) (*ns.ns)[key] = eval(*value).data();
        return ns;
      }
      if (callee.name == "range") {
        if (args.empty()) fail(e.line, "range() needs a stop");
        const int64_t start = args.size() > 1 ? as_int(args[0]) : 0, stop = as_int(args[args.size() > 1 ? 1 : 0]);
        if (stop - start > 1000000) fail(e.line, "range() of more than a million numbers");
        Json list = Json::array();
        for (int64_t i = start; i < stop; ++i) list.push_back(i);
        return Value::of(list);
      }
      if (callee.name == "strftime_now") {
        char buffer[128];
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        std::strftime(buffer, sizeof(buffer), arg_text(0).c_str(), &local);
        return Value::of(std::string(buffer));
      }
      fail(e.line, "the function " + callee.name + "() is not part of the subset (raise_exception, namespace, range, strftime_now)");
    }
    if (callee.kind != Expr::kAttr) fail(e.line, "only functions and methods can be called");
    const Value object = eval(*callee.args[0]);
    const Json& data = object.data();
    const std::string& method = callee.name;
    if (data.is_string()) {
      const std::string& s = data.get_ref<const std::string&>();
      const std::string chars = arg_text(0);
      const std::string* strip_chars = args.empty() || args[0].data().is_null() ? nullptr : &chars;
      if (method == "strip") return Value::of(strip(s, strip_chars, true, true));
      if (method == "lstrip") return Value::of(strip(s, strip_chars, true, false));
      if (method == "rstrip") return Value::of(strip(s, strip_chars, false, true));
      if (method == "startswith") return Value::of(s.rfind(chars, 0) == 0);
      if (method == "endswith") return Value::of(s.size() >= chars.size() && s.compare(s.size() - chars.size(), chars.size(), chars) == 0);
      if (method == "upper" || method == "lower") return Value::of(cased(s, method == "upper"));
      if (method == "replace") {
        std::string out;
        const std::string from = arg_text(0), to = arg_text(1);
        if (from.empty()) return Value::of(s);
        size_t at = 0;
        for (size_t found; (found = s.find(from, at)) != std::string::npos; at = found + from.size()) out += s.substr(at, found - at) + to;
        return Value::of(out + s.substr(at));
      }
      if (method == "split") {
        Json parts = Json::array();
        if (args.empty()) {  // runs of whitespace
          std::string part;
          for (const char c : s) {
            if (is_space(c)) {
              if (!part.empty()) parts.push_back(part);
              part.clear();
            } else {
              part += c;
            }
          }
          if (!part.empty()) parts.push_back(part);
          return Value::of(parts);
        }
        const std::string separator = chars;
        if (separator.empty()) fail(e.line, "split() with an empty separator");
        size_t at = 0;
        for (size_t found; (found = s.find(separator, at)) != std::string::npos; at = found + separator.size()) parts.push_back(s.substr(at, found - at));
        parts.push_back(s.substr(at));
        return Value::of(parts);
      }
    }
    if (data.is_object()) {
      if (method == "items") return Value::of(items_of(data));
      if (method == "keys" || method == "values") {
        Json out = Json::array();
        for (auto it = data.begin(); it != data.end(); ++it) out.push_back(method == "keys" ? Json(it.key()) : *it);
        return Value::of(out);
      }
      if (method == "get") {
        const Value found = member(object, args.empty() ? Json() : args[0].data());
        return found.undefined ? (args.size() > 1 ? args[1] : Value::of(nullptr)) : found;
      }
    }
    fail(e.line, "the method ." + method + "() of " + to_text(object) + " is not part of the subset");
  }

  Value filter(const Expr& e) {
    const Value value = eval(*e.args[0]);
    const std::vector<Value> args = arguments(e);
    const Json& data = value.data();
    const std::string& name = e.name;
    if (name == "trim") return Value::of(strip(to_text(value), nullptr, true, true));
    if (name == "length" || name == "count") {
      if (data.is_string()) return Value::of(static_cast<int64_t>(data.get_ref<const std::string&>().size()));
      return Value::of(static_cast<int64_t>(value.undefined || data.is_null() ? 0 : data.size()));
    }
    if (name == "string") return Value::of(to_text(value));
    if (name == "upper" || name == "lower") return Value::of(cased(to_text(value), name == "upper"));
    if (name == "tojson") {
      int indent = -1;
      for (const auto& [key, arg] : e.kwargs) {
        if (key == "indent") indent = static_cast<int>(as_int(eval(*arg)));
      }
      if (!args.empty()) indent = static_cast<int>(as_int(args[0]));
      std::string out;
      python_json(data, indent, 0, out);
      return Value::of(out);
    }
    if (name == "first" || name == "last") {
      if (data.is_array() && !data.empty()) return Value::of(name == "first" ? data.front() : data.back());
      if (data.is_string() && !data.get_ref<const std::string&>().empty()) {
        const std::string& s = data.get_ref<const std::string&>();
        return Value::of(std::string(1, name == "first" ? s.front() : s.back()));
      }
      return Value::missing();
    }
    if (name == "join") {
      std::string out;
      const std::string separator = args.empty() ? "" : to_text(args[0]);
      bool first = true;
      for (const Json& item : data) {
        if (!first) out += separator;
        first = false;
        out += to_text(Value::of(item));
      }
      return Value::of(out);
    }
    if (name == "default" || name == "d") {
      const bool boolean = args.size() > 1 && truthy(args[1]);
      if (value.undefined || (boolean && !truthy(value))) return args.empty() ? Value::of("") : args[0];
      return value;
    }
    if (name == "list") {
      if (data.is_array()) return value;
      return Value::of(sliced(data, std::nullopt, std::nullopt, 1));
    }
    if (name == "reverse") return Value::of(sliced(data, std::nullopt, std::nullopt, -1));
    if (name == "items") {
      if (!data.is_object()) fail(e.line, "|items needs a mapping, found " + to_text(value));
      return Value::of(items_of(data));
    }
    if (name == "capitalize") {
      const std::string text = to_text(value);
      return Value::of(text.empty() ? text : cased(text.substr(0, 1), true) + cased(text.substr(1), false));
    }
    if (name == "int") {
      if (data.is_number()) return Value::of(static_cast<int64_t>(data.get<double>()));
      const std::string text = strip(to_text(value), nullptr, true, true);
      char* end = nullptr;
      const long long parsed = std::strtoll(text.c_str(), &end, 10);  // Jinja's |int: 0 for what is no number
      return Value::of(end == text.c_str() + text.size() && !text.empty() ? static_cast<int64_t>(parsed) : int64_t{0});
    }
    fail(e.line, "the filter |" + name + " is not part of the subset");
  }

  bool test(const Expr& e) {
    const Value value = eval(*e.args[0]);
    const Json& data = value.data();
    const std::string& name = e.name;
    if (name == "defined") return !value.undefined;
    if (name == "undefined") return value.undefined;
    if (value.undefined) return false;
    if (name == "none") return data.is_null();
    if (name == "string") return data.is_string();
    if (name == "number") return data.is_number();
    if (name == "integer") return data.is_number_integer();
    if (name == "float") return data.is_number_float();
    if (name == "boolean") return data.is_boolean();
    if (name == "true") return data.is_boolean() && data.get<bool>();
    if (name == "false") return data.is_boolean() && !data.get<bool>();
    if (name == "mapping") return data.is_object() || static_cast<bool>(value.ns);
    if (name == "sequence" || name == "iterable") return data.is_array() || data.is_string() || data.is_object();
    if (name == "equalto" || name == "eq") return equal(data, arguments(e).at(0).data());
    fail(e.line, "the test 'is " + name + "' is not part of the subset");
  }

  std::string where_;
  std::vector<std::map<std::string, Value>> scopes_;
};

}  // namespace

ChatTemplate::ChatTemplate(std::shared_ptr<const Node> root, std::string where) : root_(std::move(root)), where_(std::move(where)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::parse(const std::string& source, const std::string& where) {
  StatementParser parser(segments_of(source, where), where);
  std::string stopped;
  std::unique_ptr<ExprParser> rest;
  NodePtr root = parser.sequence({}, &stopped, &rest);
  return ChatTemplate(std::move(root), where);
}

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  KUAFU_CHECK(in, "cannot read ", path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A special token as tokenizer_config.json writes it: a string or {"content": ...}.
std::string token_text(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) return value["content"].get<std::string>();
  return "";
}

Json context_of(const FolderTemplate& folder, const Json& messages, bool generation_prompt) {
  Json context = folder.tokens;
  context["messages"] = messages;
  context["add_generation_prompt"] = generation_prompt;
  return context;
}

}  // namespace

std::optional<FolderTemplate> read_folder_template(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path jinja = fs::path(dir) / "chat_template.jinja", config_path = fs::path(dir) / "tokenizer_config.json";
  Json config = Json::object();
  if (fs::is_regular_file(config_path)) {
    try {
      config = Json::parse(read_text(config_path));
    } catch (const Json::exception& e) {
      fail(config_path.string() + ": not valid JSON: " + e.what());
    }
  }
  std::string source, where;
  if (fs::is_regular_file(jinja)) {
    source = read_text(jinja);
    where = jinja.string();
  } else if (config.is_object() && config.contains("chat_template")) {
    const Json& t = config["chat_template"];
    where = config_path.string();
    if (t.is_string()) {
      source = t.get<std::string>();
    } else if (t.is_array()) {
      for (const Json& entry : t) {
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") && entry["template"].is_string()) {
          source = entry["template"].get<std::string>();
        }
      }
      KUAFU_CHECK(!source.empty(), where, ": chat_template lists no template named \"default\"");
    } else if (!t.is_null()) {
      fail(where + ": chat_template must be a string or a list of {\"name\", \"template\"}");
    }
  }
  if (source.empty()) return std::nullopt;
  FolderTemplate folder;
  folder.chat_template = std::make_shared<const ChatTemplate>(ChatTemplate::parse(source, where));
  for (const char* key : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
    folder.tokens[key] = config.is_object() && config.contains(key) ? token_text(config[key]) : std::string();
  }
  return folder;
}

std::vector<std::pair<std::string, bool>> template_segments(const FolderTemplate& folder, const Json& messages,
                                                            const std::string& where) {
  std::vector<std::pair<std::string, bool>> segments;
  std::string rendered;  // what the segments so far hold
  Json so_far = Json::array();
  for (const Json& message : messages) {
    if (message.is_object() && message.value("role", "") == "assistant") {
      const std::string prompt = folder.chat_template->render(context_of(folder, so_far, true));
      so_far.push_back(message);
      const std::string answered = folder.chat_template->render(context_of(folder, so_far, false));
      KUAFU_CHECK(prompt.compare(0, rendered.size(), rendered) == 0 && answered.compare(0, prompt.size(), prompt) == 0, where,
                  ": the chat template does not render this conversation turn by turn (a longer conversation changes the text "
                  "of a shorter one), so the answers' tokens cannot be told apart");
      segments.emplace_back(prompt.substr(rendered.size()), false);
      segments.emplace_back(answered.substr(prompt.size()), true);
      rendered = answered;
    } else {
      so_far.push_back(message);
    }
  }
  // Turns after the last answer (a closing question): rendered, not learned.
  const std::string whole = folder.chat_template->render(context_of(folder, so_far, false));
  KUAFU_CHECK(whole.compare(0, rendered.size(), rendered) == 0, where, ": the chat template does not render this conversation turn by turn");
  if (whole.size() > rendered.size()) segments.emplace_back(whole.substr(rendered.size()), false);
  return segments;
}

std::string template_prompt(const FolderTemplate& folder, const Json& messages) {
  return folder.chat_template->render(context_of(folder, messages, true));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  Renderer renderer(context, where_);
  std::string out;
  try {
    renderer.run(*root_, out);
  } catch (const LoopSignal&) {
    throw Error(where_ + ": {% break %} or {% continue %} outside a loop");
  }
  return out;
}

}  // namespace kuafu::io

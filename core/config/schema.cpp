// The keys an app's config accepts: declaration, constraint checks and help text.
#include "core/config/schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::config {
namespace {

// Shortest text that reads back as the same double, written as a TOML float (always has . or e).
std::string format_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buffer[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*g", precision, v);
    if (std::strtod(buffer, nullptr) == v) break;
  }
  std::string s = buffer;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// Bounds are stored as doubles; integral ones print without a fraction ("expected >= 1").
std::string format_bound(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return format_float(v);
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

template <typename T, typename Format>
std::string format_list(const std::vector<T>& items, Format format) {
  std::vector<std::string> parts;
  for (const auto& item : items) parts.push_back(format(item));
  return "[" + text::join(parts, ", ") + "]";
}

bool is_bare_key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// The numbers of a numeric value (one for a scalar), for bound checks.
std::vector<double> numbers_of(const Value& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return {static_cast<double>(*i)};
  if (const auto* d = std::get_if<double>(&value)) return {*d};
  if (const auto* is = std::get_if<std::vector<int64_t>>(&value)) return {is->begin(), is->end()};
  if (const auto* ds = std::get_if<std::vector<double>>(&value)) return *ds;
  return {};
}

std::vector<std::string> strings_of(const Value& value) {
  if (const auto* s = std::get_if<std::string>(&value)) return {*s};
  if (const auto* ss = std::get_if<std::vector<std::string>>(&value)) return *ss;
  return {};
}

bool is_list(Type type) {
  return type == Type::kIntList || type == Type::kFloatList || type == Type::kStringList;
}

bool is_numeric(Type type) {
  return type == Type::kInt || type == Type::kFloat || type == Type::kIntList || type == Type::kFloatList;
}

}  // namespace

std::string describe_type(Type type) {
  switch (type) {
    case Type::kInt:
      return "an integer";
    case Type::kFloat:
      return "a float";
    case Type::kBool:
      return "a boolean";
    case Type::kString:
      return "a string";
    case Type::kIntList:
      return "a list of integers";
    case Type::kFloatList:
      return "a list of floats";
    case Type::kStringList:
      return "a list of strings";
  }
  return "?";
}

std::string to_toml_value(const Value& value) {
  struct Visitor {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return format_float(v); }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(const std::string& v) const { return quote(v); }
    std::string operator()(const std::vector<int64_t>& v) const {
      return format_list(v, [](int64_t x) { return std::to_string(x); });
    }
    std::string operator()(const std::vector<double>& v) const { return format_list(v, format_float); }
    std::string operator()(const std::vector<std::string>& v) const { return format_list(v, quote); }
  };
  return std::visit(Visitor{}, value);
}

Field::Field(std::string key, Type type, Value default_value, std::string help)
    : key_(std::move(key)), type_(type), default_(std::move(default_value)), help_(std::move(help)) {
  KUAFU_CHECK(default_.index() == static_cast<size_t>(type_), "schema: default of '", key_, "' is not ",
              describe_type(type_));
}

Field& Field::min(double bound) {
  KUAFU_CHECK(is_numeric(type_), "schema: min() on '", key_, "', which is not numeric");
  min_ = bound;
  check_default();
  return *this;
}

Field& Field::max(double bound) {
  KUAFU_CHECK(is_numeric(type_), "schema: max() on '", key_, "', which is not numeric");
  max_ = bound;
  check_default();
  return *this;
}

Field& Field::choices(std::vector<std::string> allowed) {
  KUAFU_CHECK(type_ == Type::kString || type_ == Type::kStringList, "schema: choices() on '", key_,
              "', which is not a string");
  choices_ = std::move(allowed);
  check_default();
  return *this;
}

void Field::check_default() const {
  const std::string problem = check(default_);
  KUAFU_CHECK(problem.empty(), "schema: default of '", key_, "' breaks its own constraint: ", problem);
}

std::string Field::check(const Value& value) const {
  const std::string each = is_list(type_) ? "elements " : "";
  const std::vector<double> numbers = numbers_of(value);
  for (size_t i = 0; i < numbers.size(); ++i) {
    const std::string at = is_list(type_) ? " at index " + std::to_string(i) : "";
    // nan and inf are TOML floats, but no setting means them: refused whatever the bounds.
    if (!std::isfinite(numbers[i])) {
      return "expected " + std::string(is_list(type_) ? "finite elements" : "a finite number") + ", found " +
             format_bound(numbers[i]) + at;
    }
    // Written as !(x >= min) so that NaN is out of range too.
    if (min_ && !(numbers[i] >= *min_)) {
      return "expected " + each + ">= " + format_bound(*min_) + ", found " + format_bound(numbers[i]) + at;
    }
    if (max_ && !(numbers[i] <= *max_)) {
      return "expected " + each + "<= " + format_bound(*max_) + ", found " + format_bound(numbers[i]) + at;
    }
  }
  if (choices_.empty()) return "";
  const std::vector<std::string> strings = strings_of(value);
  for (size_t i = 0; i < strings.size(); ++i) {
    if (std::find(choices_.begin(), choices_.end(), strings[i]) != choices_.end()) continue;
    std::vector<std::string> quoted;
    for (const auto& c : choices_) quoted.push_back(quote(c));
    const std::string at = is_list(type_) ? " at index " + std::to_string(i) : "";
    return "expected " + std::string(is_list(type_) ? "each element to be " : "") + "one of " +
           text::join(quoted, ", ") + "; found " + text::abbreviate(quote(strings[i])) + at;
  }
  return "";
}

std::string Field::describe() const {
  std::string constraints;
  if (min_) constraints += ", >= " + format_bound(*min_);
  if (max_) constraints += ", <= " + format_bound(*max_);
  if (!choices_.empty()) constraints += ", one of " + text::join(choices_, "|");
  return key_ + " (" + describe_type(type_) + ", default " + to_toml_value(default_) + constraints +
         "): " + help_;
}

Field& Schema::add_int(const std::string& key, int64_t default_value, const std::string& help) {
  return add(Field(key, Type::kInt, default_value, help));
}
Field& Schema::add_float(const std::string& key, double default_value, const std::string& help) {
  return add(Field(key, Type::kFloat, default_value, help));
}
Field& Schema::add_bool(const std::string& key, bool default_value, const std::string& help) {
  return add(Field(key, Type::kBool, default_value, help));
}
Field& Schema::add_string(const std::string& key, const std::string& default_value, const std::string& help) {
  return add(Field(key, Type::kString, default_value, help));
}
Field& Schema::add_int_list(const std::string& key, std::vector<int64_t> default_value,
                            const std::string& help) {
  return add(Field(key, Type::kIntList, std::move(default_value), help));
}
Field& Schema::add_float_list(const std::string& key, std::vector<double> default_value,
                              const std::string& help) {
  return add(Field(key, Type::kFloatList, std::move(default_value), help));
}
Field& Schema::add_string_list(const std::string& key, std::vector<std::string> default_value,
                               const std::string& help) {
  return add(Field(key, Type::kStringList, std::move(default_value), help));
}

Field& Schema::add(Field field) {
  const std::string key = field.key();
  for (const auto& part : text::split(key, '.')) {
    KUAFU_CHECK(!part.empty() && std::all_of(part.begin(), part.end(), is_bare_key_char), "schema: key '",
                key, "' must be dot-separated parts of letters, digits, _ and -");
  }
  KUAFU_CHECK(!fields_.count(key), "schema: key '", key, "' is declared twice");
  // A key may not also be a section: to_toml and the TOML file itself could not hold both.
  KUAFU_CHECK(!has_section(key), "schema: key '", key, "' is also a section of other keys");
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
    KUAFU_CHECK(!fields_.count(key.substr(0, dot)), "schema: key '", key, "' is inside '", key.substr(0, dot),
                "', which is a value");
  }
  return fields_.emplace(key, std::move(field)).first->second;
}

Schema& Schema::merge(const Schema& other) {
  for (const auto& [key, field] : other.fields_) add(field);
  return *this;
}

void Schema::add_model_sections(const std::vector<std::string>& models, const std::vector<std::string>& sections) {
  std::vector<Field> copies;
  for (const auto& [key, field] : fields_) {
    bool chosen = false;
    for (const auto& section : sections) chosen = chosen || key.rfind(section + ".", 0) == 0;
    if (!chosen) continue;
    for (const auto& model : models) {
      Field copy("models." + model + "." + key, field.type(), field.default_value(), field.help());
      if (field.min_bound()) copy.min(*field.min_bound());
      if (field.max_bound()) copy.max(*field.max_bound());
      if (!field.allowed().empty()) copy.choices(field.allowed());
      copies.push_back(copy);
    }
  }
  for (auto& copy : copies) add(std::move(copy));
}

const Field* Schema::find(const std::string& key) const {
  const auto it = fields_.find(key);
  return it == fields_.end() ? nullptr : &it->second;
}

bool Schema::has_section(const std::string& prefix) const {
  const std::string dotted = prefix + ".";
  const auto it = fields_.lower_bound(dotted);
  return it != fields_.end() && text::starts_with(it->first, dotted);
}

std::vector<std::string> Schema::keys() const {
  std::vector<std::string> out;
  for (const auto& entry : fields_) out.push_back(entry.first);
  return out;
}

std::string Schema::describe() const {
  std::string out;
  for (const auto& entry : fields_) out += "  " + entry.second.describe() + "\n";
  return out;
}

}  // namespace kuafu::config

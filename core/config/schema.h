// The keys an app's config accepts: type, default, allowed range or choices, and help text.
// The core trainer declares its keys in one Schema, each app adds its own and merges them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kuafu::config {

// The alternatives of Value are in the same order as Type, so value.index() == size_t(type).
enum class Type { kInt, kFloat, kBool, kString, kIntList, kFloatList, kStringList };
using Value = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>,
                           std::vector<std::string>>;

// "an integer", "a list of floats", ...: used in "expected ..." messages.
std::string describe_type(Type type);
// `value` written as a TOML value: 3, 0.0003, true, "fp32", [1, 2].
std::string to_toml_value(const Value& value);

class Field {
 public:
  Field(std::string key, Type type, Value default_value, std::string help);

  // Inclusive bounds for numbers (each element of a numeric list). Checked against the default.
  Field& min(double bound);
  Field& max(double bound);
  // Allowed values of a string (each element of a string list). Checked against the default.
  Field& choices(std::vector<std::string> allowed);

  const std::string& key() const { return key_; }
  Type type() const { return type_; }
  const Value& default_value() const { return default_; }
  const std::string& help() const { return help_; }
  const std::optional<double>& min_bound() const { return min_; }
  const std::optional<double>& max_bound() const { return max_; }
  const std::vector<std::string>& allowed() const { return choices_; }

  // "" when `value` (already of this field's type) meets the bounds and choices, otherwise what was
  // wrong, e.g. "expected >= 1, found 0".
  std::string check(const Value& value) const;
  // One line for help output: "train.steps (integer, default 1000, >= 1): number of optimizer steps".
  std::string describe() const;

 private:
  void check_default() const;

  std::string key_;
  Type type_;
  Value default_;
  std::string help_;
  std::optional<double> min_, max_;
  std::vector<std::string> choices_;
};

class Schema {
 public:
  // Keys are dotted paths of bare TOML keys ("train.lr"). A duplicate key, or one that would be both a
  // value and a section ("train" next to "train.lr"), is a programming error: kuafu::Error.
  Field& add_int(const std::string& key, int64_t default_value, const std::string& help);
  Field& add_float(const std::string& key, double default_value, const std::string& help);
  Field& add_bool(const std::string& key, bool default_value, const std::string& help);
  Field& add_string(const std::string& key, const std::string& default_value, const std::string& help);
  Field& add_int_list(const std::string& key, std::vector<int64_t> default_value, const std::string& help);
  Field& add_float_list(const std::string& key, std::vector<double> default_value, const std::string& help);
  Field& add_string_list(const std::string& key, std::vector<std::string> default_value,
                         const std::string& help);

  // Adds every field of `other`; the same duplicate rules apply.
  Schema& merge(const Schema& other);
  // Per-model sections for a run of several models: every key under one of `sections` (e.g. "optim",
  // "precision", "memory") again as "models.<model>.<key>" for each of `models`, with the same type,
  // bounds and choices, so that each model may differ from the top-level keys (Config::model_view).
  void add_model_sections(const std::vector<std::string>& models, const std::vector<std::string>& sections);

  const Field* find(const std::string& key) const;    // nullptr when not declared
  bool has_section(const std::string& prefix) const;  // some key starts with "prefix."
  std::vector<std::string> keys() const;              // sorted
  const std::map<std::string, Field>& fields() const { return fields_; }
  // Every field's describe() line, sorted by key.
  std::string describe() const;

 private:
  Field& add(Field field);

  std::map<std::string, Field> fields_;  // map nodes keep the Field& handed out stable
};

}  // namespace kuafu::config

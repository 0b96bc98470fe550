// A validated, typed config: loading a TOML file and --set overrides against a Schema.
#include "core/config/config.h"

#include <toml++/toml.h>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>
#include <tuple>

#include "core/config/toml_nesting.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::config {
namespace {

constexpr size_t kMaxReported = 20;
// Keys longer than this get no "did you mean": none is near a schema key, and comparing costs time.
constexpr size_t kMaxSuggestedLength = 256;

std::string quoted(const std::string& s) {
  return to_toml_value(Value(std::in_place_type<std::string>, s));
}

// What a TOML node holds, for "found ..." messages: string "ten", integer 5, array [1, 2], a table.
std::string describe_node(const toml::node& node) {
  if (const auto* s = node.as_string()) return "string " + text::abbreviate(quoted(s->get()));
  if (node.is_table()) return "a table";
  std::ostringstream out;
  node.visit([&](const auto& n) { out << n; });
  std::string text = out.str();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  switch (node.type()) {
    case toml::node_type::integer:
      return "integer " + text;
    case toml::node_type::floating_point:
      return "float " + text;
    case toml::node_type::boolean:
      return "boolean " + text;
    case toml::node_type::array:
      return "array " + text;
    case toml::node_type::date:
      return "date " + text;
    case toml::node_type::time:
      return "time " + text;
    case toml::node_type::date_time:
      return "date-time " + text;
    default:
      return text;
  }
}

// A scalar of type `type` from `node`; an integer is accepted where a float is expected.
std::optional<Value> scalar(Type type, const toml::node& node) {
  switch (type) {
    case Type::kInt:
      if (const auto* v = node.as_integer()) return Value(std::in_place_type<int64_t>, v->get());
      break;
    case Type::kFloat:
      if (const auto* v = node.as_floating_point()) return Value(std::in_place_type<double>, v->get());
      if (const auto* v = node.as_integer()) return Value(std::in_place_type<double>, double(v->get()));
      break;
    case Type::kBool:
      if (const auto* v = node.as_boolean()) return Value(std::in_place_type<bool>, v->get());
      break;
    case Type::kString:
      if (const auto* v = node.as_string()) return Value(std::in_place_type<std::string>, v->get());
      break;
    default:
      break;
  }
  return std::nullopt;
}

template <typename T>
std::string convert_list(Type element, const toml::array& array, const std::string& expected, Value* out) {
  std::vector<T> items;
  for (size_t i = 0; i < array.size(); ++i) {
    const std::optional<Value> item = scalar(element, array[i]);
    if (!item) return expected + describe_node(array[i]) + " at index " + std::to_string(i);
    items.push_back(std::get<T>(*item));
  }
  *out = std::move(items);
  return "";
}

// Converts `node` to the field's type: "" on success, else "expected ..., found ...".
std::string convert(Type type, const toml::node& node, Value* out) {
  const std::string expected = "expected " + describe_type(type) + ", found ";
  const auto* array = node.as_array();
  switch (type) {
    case Type::kIntList:
      return array ? convert_list<int64_t>(Type::kInt, *array, expected, out)
                   : expected + describe_node(node);
    case Type::kFloatList:
      return array ? convert_list<double>(Type::kFloat, *array, expected, out)
                   : expected + describe_node(node);
    case Type::kStringList:
      return array ? convert_list<std::string>(Type::kString, *array, expected, out)
                   : expected + describe_node(node);
    default:
      if (std::optional<Value> value = scalar(type, node)) {
        *out = std::move(*value);
        return "";
      }
      return expected + describe_node(node);
  }
}

std::string last_component(const std::string& key) {
  return key.substr(key.rfind('.') + 1);
}

// "did you mean" target: the nearest full key, or else a key whose last component is near
// (a top-level "lr" when the schema has "optim.lr"). "" when nothing is close.
std::string suggest(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.size() > kMaxSuggestedLength) return "";
  std::string best = text::closest_match(word, candidates, std::max<size_t>(2, word.size() / 4));
  if (!best.empty()) return best;
  const std::string last = last_component(word);
  const size_t max_distance = last.size() >= 4 ? 1 : 0;
  size_t best_distance = max_distance + 1;
  for (const auto& candidate : candidates) {
    const size_t d = text::edit_distance(last, last_component(candidate), max_distance);
    if (d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace

// Fills a Config's entries from the file and the overrides, collecting every problem on the way.
class Loader {
 public:
  explicit Loader(Config& config) : config_(config), schema_(config.schema_) {}

  void load_text(const std::string& toml_text) {
    // Before parsing: toml++ and the walk below recurse once per level.
    if (const std::optional<TooDeep> deep = find_too_deep(toml_text)) {
      add_problem({kSyntax, deep->line, 0, ""},
                  config_.path_ + ":" + std::to_string(deep->line) + ": " + nesting_problem(deep->depth));
      return;
    }
    toml::table root;
    try {
      root = toml::parse(toml_text, std::string_view(config_.path_));
    } catch (const toml::parse_error& e) {
      const Where at{kSyntax, e.source().begin.line, e.source().begin.column, ""};
      add_problem(at, location(at) + ": TOML syntax error: " + text::abbreviate(e.description(), 200));
      return;
    }
    visit_table(root, "", "", 0);
  }

  void apply_override(const std::string& text) {
    const std::string where = "--set " + text::abbreviate(text);
    const size_t eq = text.find('=');
    const std::string key = eq == std::string::npos ? "" : text::trim(text.substr(0, eq));
    if (key.empty()) {
      add_problem({kOverride, 0, 0, where}, "'" + where + "': expected --set KEY=VALUE");
      return;
    }
    const std::string raw = text::trim(text.substr(eq + 1));
    // Scanned as the file line it stands for, so that it nests no deeper than a file may.
    if (const std::optional<TooDeep> deep = find_too_deep(key + " = " + raw)) {
      add_problem({kOverride, 0, 0, where}, where + ": " + nesting_problem(deep->depth));
      return;
    }
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + raw);
    } catch (const toml::parse_error&) {
    }
    const toml::node* node = parsed.size() == 1 ? parsed.get("v") : nullptr;
    // Text that is not one TOML value is a bare string. So is anything given for a string key that
    // is not a TOML string (a run named 2024-01-01 must not fail as a date).
    const toml::value<std::string> bare(raw);
    const Field* field = schema_.find(key);
    if (!node || (field && field->type() == Type::kString && !node->is_string())) node = &bare;
    visit(*node, key, {kOverride, 0, 0, where}, 1);
  }

  // Throws one kuafu::Error listing the problems, file ones in file order.
  void finish() {
    if (problems_.empty()) return;
    std::stable_sort(problems_.begin(), problems_.end(), [](const Problem& a, const Problem& b) {
      return std::tie(a.at.group, a.at.line, a.at.column) < std::tie(b.at.group, b.at.line, b.at.column);
    });
    if (problems_.size() == 1) throw Error("invalid configuration: " + problems_[0].text);
    std::string message = "invalid configuration (" + std::to_string(problems_.size()) + " problems):";
    for (size_t i = 0; i < std::min(problems_.size(), kMaxReported); ++i) {
      message += "\n  " + problems_[i].text;
    }
    if (problems_.size() > kMaxReported) {
      message += "\n  ... and " + std::to_string(problems_.size() - kMaxReported) + " more";
    }
    throw Error(message);
  }

 private:
  enum Group { kSyntax = 0, kFile = 1, kOverride = 2 };
  // Where a key or value was written: a file position, or the --set text.
  struct Where {
    Group group;
    uint32_t line, column;
    std::string override_text;  // "--set a.b=c" for overrides
  };
  struct Problem {
    Where at;
    std::string text;
  };

  std::string location(const Where& at) const {
    if (at.group == kOverride) return at.override_text;
    return config_.path_ + ":" + std::to_string(at.line) + ":" + std::to_string(at.column);
  }
  Where where_of(const toml::source_region& region, const Where& parent) const {
    if (parent.group == kOverride) return parent;
    return {kFile, region.begin.line, region.begin.column, ""};
  }

  void add_problem(Where at, std::string text) { problems_.push_back({std::move(at), std::move(text)}); }

  // `depth`: the table's level below the root (0 for the root). NestingScan keeps it within
  // kMaxNesting; the check here keeps the recursion bounded even if the scan were wrong.
  void visit_table(const toml::table& table, const std::string& prefix, const std::string& override_text,
                   size_t depth) {
    const Where parent{override_text.empty() ? kFile : kOverride, 0, 0, override_text};
    for (auto&& [name, node] : table) {
      const std::string key =
          prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
      const Where key_at = where_of(name.source(), parent);
      if (depth + 1 > kMaxNesting) {
        add_problem(key_at, location(key_at) + ": " + nesting_problem(depth + 1));
        return;
      }
      visit(node, key, key_at, depth + 1);
    }
  }

  // `key_at` is where the key was written; type and range problems point at the value instead.
  void visit(const toml::node& node, const std::string& key, const Where& key_at, size_t depth) {
    const Where value_at = where_of(node.source(), key_at);
    if (const Field* field = schema_.find(key)) {
      assign(*field, node, value_at);
      return;
    }
    const auto* table = node.as_table();
    if (schema_.has_section(key)) {
      if (table) {
        visit_table(*table, key, key_at.override_text, depth);
      } else {
        const std::string example = schema_.fields().lower_bound(key + ".")->first;
        add_problem(value_at, "key '" + text::abbreviate(key) + "' at " + location(value_at) +
                                  ": expected a section of keys such as '" + example + "', found " +
                                  describe_node(node));
      }
      return;
    }
    // An unknown section with keys inside: each key gets its own, more precise, suggestion.
    if (table && !table->empty()) {
      visit_table(*table, key, key_at.override_text, depth);
      return;
    }
    const std::string what = table ? "section" : "key";
    const std::string suggestion = suggest(key, table ? sections() : schema_.keys());
    add_problem(key_at, "unknown " + what + " '" + text::abbreviate(key) + "' at " + location(key_at) +
                            (suggestion.empty() ? "" : "; did you mean '" + suggestion + "'?"));
  }

  void assign(const Field& field, const toml::node& node, const Where& at) {
    Value value;
    std::string problem = convert(field.type(), node, &value);
    if (problem.empty()) problem = field.check(value);
    if (!problem.empty()) {
      add_problem(at, "key '" + field.key() + "' at " + location(at) + ": " + problem);
      return;
    }
    Config::Entry& entry = config_.entries_.at(field.key());
    entry.value = std::move(value);
    entry.set = true;
    entry.location = location(at);
    entry.source = at.group == kOverride ? "--set" : config_.path_ + ":" + std::to_string(at.line);
  }

  // Every proper dotted prefix of a schema key ("parallel", "parallel.tensor").
  std::vector<std::string> sections() const {
    std::vector<std::string> out;
    for (const auto& key : schema_.keys()) {
      for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
        out.push_back(key.substr(0, dot));
      }
    }
    return out;
  }

  Config& config_;
  const Schema& schema_;
  std::vector<Problem> problems_;
};

Config Config::load(const std::string& path, const Schema& schema,
                    const std::vector<std::string>& overrides) {
  std::error_code ec;
  KUAFU_CHECK(std::filesystem::exists(path, ec), "config file '", path, "' does not exist");
  KUAFU_CHECK(!std::filesystem::is_directory(path, ec), "config file '", path, "' is a directory");
  std::ifstream in(path, std::ios::binary);
  KUAFU_CHECK(in, "cannot read config file '", path, "': ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return from_string(text.str(), path, schema, overrides);
}

Config Config::from_string(const std::string& toml_text, const std::string& source_name, const Schema& schema,
                           const std::vector<std::string>& overrides) {
  Config config;
  config.schema_ = schema;
  config.path_ = source_name;
  for (const auto& [key, field] : schema.fields()) config.entries_[key].value = field.default_value();
  Loader loader(config);
  loader.load_text(toml_text);
  for (const auto& override_text : overrides) loader.apply_override(override_text);
  loader.finish();
  return config;
}

const Config::Entry& Config::entry(const std::string& key) const {
  const auto it = entries_.find(key);
  if (it == entries_.end()) {
    const std::string near = text::closest_match(key, schema_.keys(), 2);
    fail("config key '" + key + "' is not declared in the schema" +
         (near.empty() ? "" : "; did you mean '" + near + "'?"));
  }
  return it->second;
}

const Value& Config::typed(const std::string& key, Type type) const {
  const Value& value = entry(key).value;
  {
    const std::lock_guard<std::mutex> lock(shared_->mutex);
    ++shared_->reads[view_of_.empty() ? key : "models." + view_of_ + "." + key];
  }
  KUAFU_CHECK(value.index() == static_cast<size_t>(type), "config key '", key, "' holds ",
              describe_type(static_cast<Type>(value.index())), ", not ", describe_type(type));
  return value;
}

int64_t Config::get_int(const std::string& key) const {
  return std::get<int64_t>(typed(key, Type::kInt));
}
double Config::get_float(const std::string& key) const {
  return std::get<double>(typed(key, Type::kFloat));
}
bool Config::get_bool(const std::string& key) const {
  return std::get<bool>(typed(key, Type::kBool));
}
std::string Config::get_string(const std::string& key) const {
  return std::get<std::string>(typed(key, Type::kString));
}
std::vector<int64_t> Config::get_int_list(const std::string& key) const {
  return std::get<std::vector<int64_t>>(typed(key, Type::kIntList));
}
std::vector<double> Config::get_float_list(const std::string& key) const {
  return std::get<std::vector<double>>(typed(key, Type::kFloatList));
}
std::vector<std::string> Config::get_string_list(const std::string& key) const {
  return std::get<std::vector<std::string>>(typed(key, Type::kStringList));
}

int Config::reads(const std::string& key) const {
  const std::lock_guard<std::mutex> lock(shared_->mutex);
  const auto found = shared_->reads.find(key);
  return found == shared_->reads.end() ? 0 : found->second;
}

bool Config::is_set(const std::string& key) const {
  return entry(key).set;
}
std::string Config::source_of(const std::string& key) const {
  return entry(key).source;
}

Config Config::model_view(const std::string& model) const {
  const std::string prefix = "models." + model + ".";
  Config view = *this;
  view.view_of_ = model;
  for (const auto& [key, e] : entries_) {
    if (!e.set || key.rfind(prefix, 0) != 0) continue;
    const std::string base = key.substr(prefix.size());
    KUAFU_CHECK(entries_.count(base), "config key '", key, "' has no top-level key '", base, "'");
    Entry own = e;
    own.location = key + " at " + e.location;
    view.entries_[base] = own;
  }
  return view;
}

void Config::fail_at(const std::string& key, const std::string& message) const {
  const Entry& e = entry(key);
  const std::string where = e.set ? " at " + e.location : " (default " + to_toml_value(e.value) + ")";
  fail("invalid configuration: key '" + key + "'" + where + ": " + message);
}

std::string Config::to_toml() const {
  // Top-level keys must come before the first [section]; keys sharing a section are adjacent in the map.
  std::string top, sections, current;
  for (const auto& [key, e] : entries_) {
    const size_t dot = key.find('.');
    std::string line;
    if (dot == std::string::npos) {
      line = key;
    } else {
      const std::string section = key.substr(0, dot);
      if (section != current) {
        sections += (current.empty() ? "[" : "\n[") + section + "]\n";
        current = section;
      }
      line = key.substr(dot + 1);
    }
    line += " = " + to_toml_value(e.value) + (e.set ? "  # " + e.source : "") + "\n";
    (dot == std::string::npos ? top : sections) += line;
  }
  return "# Effective configuration of " + path_ + "; comments name where non-default values came from.\n" +
         top + (top.empty() || sections.empty() ? "" : "\n") + sections;
}

bool Config::operator==(const Config& other) const {
  if (entries_.size() != other.entries_.size()) return false;
  return std::equal(
      entries_.begin(), entries_.end(), other.entries_.begin(),
      [](const auto& a, const auto& b) { return a.first == b.first && a.second.value == b.second.value; });
}

}  // namespace kuafu::config

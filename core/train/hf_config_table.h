// A model's shape as one table instead of four lists: each row names a field of the app's model config
// struct, its key in a Hugging Face config.json and its key in Kuafu's config (model.<json key> unless
// the row says otherwise). The same rows read config.json, write it, read the model.* keys, and check a
// config against the folder model.init_from names.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "core/config/config.h"
#include "core/io/hf_folder.h"

namespace kuafu::train {

template <class C>
struct HfField {
  std::string json_key;
  std::variant<int64_t C::*, double C::*, bool C::*> member;
  std::optional<double> fallback = std::nullopt;  // when config.json may omit it; none: required
  std::string config_key = "";  // "": model.<json_key>; "-": no key in Kuafu's config
  bool tunable = false;         // a fine-tune may change it (dropout): a set model.* key overrides the folder's
};

template <class C>
class HfConfigTable {
 public:
  explicit HfConfigTable(std::vector<HfField<C>> fields) : fields_(std::move(fields)) {}

  // The rows' fields from config.json (`where` names it in errors).
  void read_json(const nlohmann::json& json, const std::string& where, C& c) const {
    for (const HfField<C>& f : fields_) {
      std::visit(
          [&](auto member) {
            using T = std::remove_reference_t<decltype(c.*member)>;
            c.*member = f.fallback ? io::config_value<T>(json, f.json_key, static_cast<T>(*f.fallback), where)
                                   : io::config_required<T>(json, f.json_key, where);
          },
          f.member);
    }
  }

  // kuafu::Error naming `where` and the key when a field read from config.json lies outside the bounds
  // `schema` gives its Kuafu key: a folder may not ask for more than the TOML config could (a
  // hidden_size of 1,000,000,002 would otherwise reach the allocator).
  void check_bounds(const config::Schema& schema, const std::string& where, const C& c) const {
    for (const HfField<C>& f : fields_) {
      const std::string key = config_key(f);
      const config::Field* field = key.empty() ? nullptr : schema.find(key);
      if (!field) continue;
      std::visit(
          [&](auto member) {
            const std::string wrong = field->check(config::Value(c.*member));
            KUAFU_CHECK(wrong.empty(), where, ": \"", f.json_key, "\" ", wrong, " (the bounds of ", key, ")");
          },
          f.member);
    }
  }

  nlohmann::json to_json(const C& c) const {
    nlohmann::json json = nlohmann::json::object();
    for (const HfField<C>& f : fields_) std::visit([&](auto member) { json[f.json_key] = c.*member; }, f.member);
    return json;
  }

  // The rows' fields from the model.* keys.
  void read_config(const config::Config& config, C& c) const {
    for (const HfField<C>& f : fields_) {
      if (const std::string key = config_key(f); !key.empty()) std::visit([&](auto member) { c.*member = get(config, key, member); }, f.member);
    }
  }

  // `c` came from model.init_from's folder: a model.* key the config sets must agree with it
  // (kuafu::Error at the key), except the tunable ones, which replace the folder's values.
  void merge_config(const config::Config& config, C& c) const {
    for (const HfField<C>& f : fields_) {
      const std::string key = config_key(f);
      if (key.empty() || !config.is_set(key)) continue;
      std::visit(
          [&](auto member) {
            const auto value = get(config, key, member);
            if (f.tunable) {
              c.*member = value;
            } else if (value != c.*member) {
              std::ostringstream shown;
              shown << std::boolalpha << c.*member;
              config.fail_at(key, "disagrees with model.init_from = " + config.get_string("model.init_from") +
                                      ", whose config.json has " + shown.str() + "; remove the key or make it agree");
            }
          },
          f.member);
    }
  }

 private:
  static std::string config_key(const HfField<C>& f) {
    if (f.config_key == "-") return "";
    return f.config_key.empty() ? "model." + f.json_key : f.config_key;
  }
  static int64_t get(const config::Config& config, const std::string& key, int64_t C::*) { return config.get_int(key); }
  static double get(const config::Config& config, const std::string& key, double C::*) { return config.get_float(key); }
  static bool get(const config::Config& config, const std::string& key, bool C::*) { return config.get_bool(key); }

  std::vector<HfField<C>> fields_;
};

}  // namespace kuafu::train

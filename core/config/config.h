// A validated, typed config: a TOML file plus --set overrides, checked against a Schema at load.
// Every problem found is reported at once, with file:line:column, key, expectation and finding.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/config/schema.h"

namespace kuafu::config {

class Config {
 public:
  // Reads and validates `path`; `overrides` are "key=value" strings from --set, applied in order after
  // the file. The value is read as a TOML value (3, 3.5, true, "x", [1, 2]) or else as a bare string.
  // Throws kuafu::Error listing every problem (or naming the path when it cannot be read).
  static Config load(const std::string& path, const Schema& schema,
                     const std::vector<std::string>& overrides = {});
  // Same, from text; `source_name` stands in for the file name in messages and source_of().
  static Config from_string(const std::string& toml_text, const std::string& source_name,
                            const Schema& schema, const std::vector<std::string>& overrides = {});

  // Typed access. An undeclared key, or a getter of the wrong type, is a programming error: kuafu::Error.
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;
  std::vector<double> get_float_list(const std::string& key) const;
  std::vector<std::string> get_string_list(const std::string& key) const;

  // True when the file or an override gave the key; false when it holds its default.
  bool is_set(const std::string& key) const;
  // "quickstart.toml:12", "--set" or "default".
  std::string source_of(const std::string& key) const;
  // Throws kuafu::Error in the style of the validation errors, for checks across keys:
  //   config.fail_at("train.batch_size", "must divide by the data-parallel size 4")
  [[noreturn]] void fail_at(const std::string& key, const std::string& message) const;

  // The config as model `model` of a run of several models sees it (Schema::add_model_sections): each
  // key under "models.<model>." that the file or an override set replaces the top-level key of the same
  // name, which stays the default for every model. Errors at such a key name where it was set.
  Config model_view(const std::string& model) const;
  // The model a view is of ("" for the config itself).
  const std::string& view_of() const { return view_of_; }

  // A value worked out once from this config and shared with its model views, which read the same file
  // (a command's settings that several parts use, such as how each model is held): the first call under
  // `key` makes it, later calls return it.
  template <class T>
  const T& once(const std::string& key, const std::function<T()>& make) const {
    std::shared_ptr<const void> value;
    {
      const std::lock_guard<std::mutex> lock(shared_->mutex);
      value = shared_->once[key];
    }
    if (!value) {
      value = std::make_shared<const T>(make());  // outside the lock: `make` reads keys
      const std::lock_guard<std::mutex> lock(shared_->mutex);
      auto& slot = shared_->once[key];
      if (!slot) slot = value;
      value = slot;
    }
    return *std::static_pointer_cast<const T>(value);
  }
  // How many times this config and its views have read `key` with a getter, a view's reads counted
  // under its models.<model>.<key> (for tests that a setting is read once).
  int reads(const std::string& key) const;

  // The effective config: every key, sections by first dotted component, sorted; explicitly set
  // values carry a comment naming their source. from_string() reads it back to an equal Config.
  std::string to_toml() const;
  // The file name (or source_name) the config came from.
  const std::string& path() const { return path_; }
  const Schema& schema() const { return schema_; }

  // Same effective values (where they came from is not compared).
  bool operator==(const Config& other) const;
  bool operator!=(const Config& other) const { return !(*this == other); }

 private:
  struct Entry {
    Value value;
    bool set = false;
    std::string source = "default";  // what source_of() returns
    std::string location;            // "quickstart.toml:12:9" or "--set a.b=c"; empty for defaults
  };
  friend class Loader;

  Config() = default;  // only load() and from_string() make one

  const Entry& entry(const std::string& key) const;
  const Value& typed(const std::string& key, Type type) const;

  // What the config and its views share.
  struct Shared {
    std::mutex mutex;
    std::map<std::string, std::shared_ptr<const void>> once;
    std::map<std::string, int> reads;
  };

  Schema schema_;
  std::map<std::string, Entry> entries_;
  std::string path_;
  std::string view_of_;
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

}  // namespace kuafu::config

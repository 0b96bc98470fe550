// A model class as Hugging Face folders hold it, declared as data instead of five functions per app:
// its model_type, its config.json numbers (HfConfigTable), the values written as they are, what else
// must hold of a folder's config.json, and its tensor names (HfWeightNames). From these come reading
// and writing config.json, loading a folder onto any tensor-parallel layout, exporting, and starting a
// run from model.init_from.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>

#include "core/config/config.h"
#include "core/io/hf_folder.h"
#include "core/train/hf_config_table.h"
#include "core/train/hf_interop.h"
#include "core/train/lazy_model.h"
#include "core/util/error.h"
#include "core/util/logging.h"
#include "core/util/text.h"

namespace kuafu::train {

// `Model`: the app's module holder, built as Model(C, parallel::ModelOptions), with ->config and ->tp.
template <class Model, class C>
struct HfModelFormat {
  std::string model_type;  // config.json's, e.g. "gpt2"
  std::string name;        // for messages, e.g. "GPT-2"
  HfConfigTable<C> numbers;
  nlohmann::json constants;  // written as they are (architectures, activation, tied embeddings, ...)
  // What a folder's config.json must also say, and fields the table does not fill; kuafu::Error naming
  // `where` and the key (e.g. an activation Kuafu's model does not compute).
  std::function<void(const nlohmann::json& json, const std::string& where, C& c)> finish;
  HfWeightNames names;
  // The app's schema, whose model.* bounds the config.json's sizes must meet (none: unchecked).
  std::function<config::Schema()> bounds = nullptr;
  // What config.json holds beyond the table and the constants (nested or listed values); null: nothing.
  std::function<void(const C& c, nlohmann::json& json)> write_rest = nullptr;
  // The tensor names of a model of config `c` when they depend on it (a tied or untied head); null: `names`.
  std::function<HfWeightNames(const C& c)> names_of = nullptr;

  // kuafu::Error naming `where` (the config.json) for another model_type, a missing or malformed key.
  C read_config(const nlohmann::json& json, const std::string& where) const {
    const std::string type = io::config_value<std::string>(json, "model_type", "", where);
    KUAFU_CHECK(type == model_type, where, ": model_type \"", text::abbreviate(type), "\" is not ", name, " (\"",
                model_type, "\")");
    C c;
    numbers.read_json(json, where, c);
    if (bounds) numbers.check_bounds(bounds(), where, c);
    if (finish) finish(json, where, c);
    return c;
  }

  nlohmann::json write_config(const C& c) const {
    nlohmann::json json = numbers.to_json(c);
    json.update(constants);
    json["model_type"] = model_type;
    if (write_rest) write_rest(c, json);
    return json;
  }

  // The tensor names of a model of config `c`.
  HfWeightNames names_for(const C& c) const { return names_of ? names_of(c) : names; }

  // `folder`'s weights into `model` (built from the folder's config), on any tensor-parallel layout.
  void load_weights(Model& model, const io::HfFolder& folder) const {
    load_pretrained(*model, model->tp, folder, names_for(model->config));
  }

  // The model `dir` holds, whole (serial) on `device`, its weights read straight into `dtype`: the model
  // is described on the meta device and given storage before the folder fills it (nothing is drawn).
  Model load(const std::string& dir, torch::Device device = torch::kCPU, torch::Dtype dtype = torch::kFloat32) const {
    const io::HfFolder folder = io::read_hf_folder(dir);
    Model model(read_config(folder.config, dir + "/config.json"), parallel::ModelOptions::serial_on(torch::kMeta));
    materialize(*model, Materialization::all_in(device, dtype));
    load_weights(model, folder);
    return model;
  }

  // Writes `model` (serial) as a new folder `dir`, float32, a tied head stored once.
  void save(Model& model, const std::string& dir, const io::HfWriteOptions& options = {}) const {
    export_pretrained(*model, model->tp, dir, write_config(model->config), options);
  }

  // The shape of model.init_from's folder, the config's tunable model.* keys (dropout) applied and the
  // others checked against it; nullopt when model.init_from names no folder.
  std::optional<C> init_config(const config::Config& config) const {
    const std::string folder = init_from(config);
    if (folder.empty()) return std::nullopt;
    C c = read_config(io::read_hf_config(folder), folder + "/config.json");
    numbers.merge_config(config, c);
    return c;
  }

  // model.init_from's weights into `model` when it names a folder (a resumed run's checkpoint
  // replaces them later).
  void load_init_weights(const config::Config& config, Model& model) const {
    if (const std::string folder = init_from(config); !folder.empty()) {
      load_weights(model, io::read_hf_folder(folder));
      log::infof("initial weights from ", folder);
    }
  }
};

}  // namespace kuafu::train

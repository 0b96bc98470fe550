// One declaration of how a model is made, and one builder that makes it for a purpose as the run holds it.
// A recipe says how the model is described (on the meta device), drawn (the serial model's seeded
// draws, or a folder's read for a model whose every weight comes from one), loaded (model.init_from's
// weights) and adapted (LoRA adapters over a frozen base), and whether it trains. The builder reads the
// memory strategy (train::held_model), the compute dtype and memory.offload_frozen from the model's own
// section (models.<name> over the top-level keys) and returns the model materialised, or, for a trained
// model whose strategy shards (ZeRO, Gemini), described with the DeferredWeights its state fills it from.
//   ModelRecipe<GPT> recipe{"", /*trained=*/true, described<GPT>(shape), seeded_initialization<GPT>(seed)};
//   Built<GPT> built = build(recipe, config, {Purpose::benchmark, ModelOptions::serial_on(device), false});
//   LaidOut laid = lay_out(recipe, described, config, options, runtime, sample);  // a training task's
//   GPT loaded = build_as(recipe, Materialization::all_in(device, dtype));       // placed by its caller
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/config/config.h"
#include "core/parallel/tensor/factory.h"
#include "core/train/hf_interop.h"
#include "core/train/lazy_model.h"
#include "core/train/model_memory.h"
#include "core/train/parallelize.h"
#include "core/util/logging.h"
#include "core/util/weight_sink.h"

namespace kuafu::train {

enum class Purpose { train, benchmark, evaluate, generate, export_weights };
// Whether a purpose runs the model as training holds it (its strategy, compute dtype, frozen base).
bool trains(Purpose purpose);

template <class Model>
struct ModelRecipe {
  std::string name;    // its section models.<name> and checkpoint part; "" for an app's one model
  bool trained = true; // false: a frozen model of the run (held as train::FrozenModel holds it)
  // The model described with `options`' layers and cuts (the device is set to meta: no storage).
  std::function<Model(parallel::ModelOptions options)> describe = nullptr;
  // Its first values, on a model given storage or into the WeightSink in scope for a described one.
  std::function<void(Model&)> draw = nullptr;
  // Its starting weights over the draws (model.init_from's folder); null: none.
  std::function<void(Model&)> load = nullptr;
  // Whether `load` gives every weight (a whole folder): then it runs instead of the draws, so nothing is
  // filled twice.
  bool load_gives_every_weight = false;
  // Trained parts added over the loaded weights, which then stay frozen while it trains (a LoRA run's
  // adapters; `host_base`: the base lies in host memory, so the adapters go to the run's device); null: none.
  std::function<void(Model&, std::optional<torch::Device> host_base)> adapt = nullptr;
  // Its parameter count, worked out from its settings before anything is built (the fit check's), and
  // the settings that give it (named when it does not fit).
  double parameters = 0;
  std::vector<std::string> size_keys = {};
};

// The model as the fit check counts it: its adapters' base frozen (the adapters, a fraction of a percent,
// are not counted).
template <class Model>
SizedModel sized(const ModelRecipe<Model>& recipe) {
  return {recipe.name, recipe.parameters, recipe.adapt ? recipe.parameters : 0.0, recipe.trained, recipe.size_keys};
}

struct ModelUse {
  Purpose purpose = Purpose::evaluate;
  parallel::ModelOptions options;  // the layout and the run's device
  bool starting_weights = true;    // false: the draws only (a checkpoint's weights replace them, or a benchmark's)
  std::function<bool(const std::string& name)> holds = nullptr;  // the parameters this rank holds (null: all)
};

// How a model is made for a use, from its section: left described for a sharded strategy, or given
// storage as `how` says.
struct Placing {
  bool described = false;
  Materialization how;
};
// `trained` and `frozen_base` as the recipe says (frozen_base: it has adapters).
Placing placing_for(const config::Config& config, const std::string& name, const ModelUse& use, bool trained, bool frozen_base);

// A recipe's describe for a model holder made as Model(args..., options) on the meta device.
template <class Model, class... Args>
std::function<Model(parallel::ModelOptions)> described(Args... args) {
  return [args...](parallel::ModelOptions options) {
    options.device = torch::kMeta;
    return Model(args..., options);
  };
}

// The same for a model that is never cut, made whole as Model(args..., device) (SD's UNet and VAE).
template <class Model, class... Args>
std::function<Model(parallel::ModelOptions)> described_whole(Args... args) {
  return [args...](const parallel::ModelOptions&) { return Model(args..., torch::Device(torch::kMeta)); };
}

// A recipe's load of the folder model.init_from names in `config` (null when it names none): `read(model,
// folder)`, then a line saying where the weights came from.
template <class Model>
std::function<void(Model&)> init_from_load(const config::Config& config, std::function<void(Model&, const std::string&)> read) {
  const std::string folder = init_from(config);
  if (folder.empty()) return nullptr;
  return [folder, read](Model& model) {
    read(model, folder);
    log::infof("initial weights from ", folder);
  };
}

// The config as model `name` reads it: models.<name>.* over the top-level keys ("": the config itself).
config::Config section_of(const config::Config& config, const std::string& name);

// The module of a model holder (GPT, ScoredModel, ...) or of a causal LM pointer (its ->module()).
template <class Model>
torch::nn::Module& module_of(Model& model) {
  auto& held = *model;
  if constexpr (std::is_base_of_v<torch::nn::Module, std::decay_t<decltype(held)>>) {
    return held;
  } else {
    return held.module();
  }
}

// Gives a described model its storage and values as `placing` says (draws, then starting weights, then
// adapters); or leaves it described and returns how its strategy fills it (each replay on a fresh
// description).
template <class Model>
DeferredWeights place_as(const ModelRecipe<Model>& recipe, Model& described, const Placing& placing, const ModelUse& use) {
  std::function<void(Model&)> draw = recipe.draw, load = use.starting_weights ? recipe.load : nullptr;
  if (load && recipe.load_gives_every_weight) {
    draw = load;
    load = nullptr;
  }
  if (placing.described) {
    return deferred_from<Model>(use.options.device, [describe = recipe.describe, options = use.options] { return describe(options); },
                                draw, load);
  }
  materialize(module_of(described), placing.how);
  const bool on_host = static_cast<bool>(placing.how.on_host);
  {
    // Weights held in host memory are still drawn on the run's device, as an eager model's are.
    const WeightSink draw_here{use.options.device, [](const std::string&) { return false; }, nullptr};
    std::optional<ScopedWeightSink> scope;
    if (on_host) scope.emplace(draw_here);
    draw(described);
  }
  if (load) load(described);
  if (recipe.adapt) recipe.adapt(described, on_host ? std::optional<torch::Device>(use.options.device) : std::nullopt);
  return {};
}

// place_as for `use` as the model's section says (placing_for): for a trained model whose strategy
// shards, left described.
template <class Model>
DeferredWeights place(const ModelRecipe<Model>& recipe, Model& described, const config::Config& config, const ModelUse& use) {
  return place_as(recipe, described, placing_for(config, recipe.name, use, recipe.trained, static_cast<bool>(recipe.adapt)), use);
}

// A model made for a use, whole: materialised, or described with `deferred` set.
template <class Model>
struct Built {
  Model model;
  DeferredWeights deferred;
};

template <class Model>
Built<Model> build(const ModelRecipe<Model>& recipe, const config::Config& config, const ModelUse& use) {
  Model model = recipe.describe(use.options);
  DeferredWeights deferred = place(recipe, model, config, use);
  return {std::move(model), std::move(deferred)};
}

// A model made whole as `how` says, outside a run's sections (a model to chat with, or one its caller
// places): described, given storage, drawn (a folder's read for a model loaded whole), loaded, adapted.
template <class Model>
Model build_as(const ModelRecipe<Model>& recipe, const Materialization& how) {
  const ModelUse use{Purpose::evaluate, parallel::ModelOptions::serial_on(how.device)};
  Model model = recipe.describe(use.options);
  place_as(recipe, model, Placing{false, how}, use);
  return model;
}

// A block model's layout and how its trained weights are filled.
struct LaidOut {
  ParallelOptions layout;
  DeferredWeights deferred;
};

// A task's model laid out and placed: with `runtime` (training), the layout the config asks for (its
// partition may time `sample()`) and only this rank's pipeline stage given storage; without (evaluation),
// whole and in float32.
template <class Model>
LaidOut lay_out(const ModelRecipe<Model>& recipe, Model& described, const config::Config& config,
                const parallel::ModelOptions& options, const Runtime* runtime, const std::function<Batch()>& sample) {
  hooks::BlockModel& blocks = *described;
  LaidOut laid;
  if (runtime) laid.layout = parallel_options(blocks, config, *runtime, sample());
  const StageParts parts = stage_parts(blocks, laid.layout.plan);
  const ModelUse use{runtime ? Purpose::train : Purpose::evaluate, options, /*starting_weights=*/true,
                     [&parts](const std::string& name) { return parts.holds(name); }};
  laid.deferred = place(recipe, described, config, use);
  return laid;
}

}  // namespace kuafu::train

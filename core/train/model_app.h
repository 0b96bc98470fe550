// An app whose commands export, generate with and benchmark one model declared by a ModelRecipe: the
// skeleton builds it for each purpose (whole in float32 for export and generation; for the benchmark as
// training holds it, described under ZeRO and Gemini with its DeferredWeights kept for the benchmark).
#pragma once

#include <optional>

#include "core/train/app.h"
#include "core/train/model_recipe.h"
#include "core/util/error.h"

namespace kuafu::train {

template <class Model>
class ModelApp : public App {
 public:
  explicit ModelApp(const config::Config& config) : config_(config) {}

  // The declared model's size, from its recipe: the run's unless an app of several models says otherwise,
  // and build_model's and the benchmark's (the declared model alone) unless it does.
  ModelSize model_size() override { return built_model_size(); }
  ModelSize built_model_size() override { return size_of({sized(recipe())}); }
  ModelSize benchmark_size() override { return built_model_size(); }
  torch::nn::Module& build_model(const torch::Device& device, bool starting_weights) override {
    built_.emplace(build(recipe(), config_, {Purpose::generate, parallel::ModelOptions::serial_on(device), starting_weights}));
    return module_of(built_->model);
  }
  void build_benchmark_model(const Runtime& runtime) override {
    built_.emplace(build(recipe(), config_, {Purpose::benchmark, parallel::ModelOptions::serial_on(runtime.device),
                                             /*starting_weights=*/false}));
  }

 protected:
  // The app's model as its settings declare it.
  virtual ModelRecipe<Model> recipe() const = 0;
  // build_model's or build_benchmark_model's model.
  Model& model() {
    KUAFU_CHECK(built_, "the app's model is used before it is built");
    return built_->model;
  }
  // The benchmark model's weights when it is left described for ZeRO and Gemini (empty otherwise).
  DeferredWeights deferred() const { return built_ ? built_->deferred : DeferredWeights{}; }

  const config::Config& config_;

 private:
  std::optional<Built<Model>> built_;
};

}  // namespace kuafu::train

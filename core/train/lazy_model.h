// Lazy construction: a model is first described on the meta device (its layers made with
// parallel::ModelOptions::device = torch::kMeta: names, shapes and tensor-parallel layouts, no storage),
// and given storage only once a rank knows what it holds (its pipeline stage, its tensor-parallel
// blocks) and in which dtype each parameter lives (float32 where it trains and masters are made from it,
// the compute dtype where it stays frozen). Building then never holds more than training does: no
// float32 copy of a model that runs in bf16, no other stage's layers, no whole tensor of a cut one.
//   model = Model(config, {tp, torch::kMeta});                 // nothing allocated
//   train::materialize(*model, {device, dtype_of, holds});     // storage, zero-filled
//   torch::manual_seed(seed); model->initialize();             // the serial model's draws, replayed
//   train::load_pretrained(*model, tp, folder, names);         // one stored tensor at a time
// Under ZeRO and Gemini the trained weights are not materialised at all: the task hands ModelState
// the recipe (core/util/weight_sink.h, DeferredWeights) and the strategy writes each value into its
// chunk as it is drawn or read.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>

#include "core/config/config.h"
#include "core/util/weight_sink.h"

namespace kuafu::train {

struct Materialization {
  torch::Device device = torch::kCPU;
  // Each parameter's dtype, by name (null: float32).
  std::function<torch::Dtype(const std::string& name)> dtype_of = nullptr;
  // Whether this rank holds a parameter (null: all). One it does not stays on the meta device: another
  // pipeline stage's, which ParallelModel then drops.
  std::function<bool(const std::string& name)> holds = nullptr;
  // Whether a parameter is made in host memory instead (page-locked when `device` is a GPU): the frozen
  // weights memory.offload_frozen keeps there (null: none). Initialise such a model with a WeightSink
  // on `device` in scope, so its values are drawn where an eager model's are.
  std::function<bool(const std::string& name)> on_host = nullptr;

  // Every parameter on `device` in `dtype` (a model loaded whole, or frozen in its compute dtype).
  static Materialization all_in(const torch::Device& device, torch::Dtype dtype) {
    return {device, [dtype](const std::string&) { return dtype; }};
  }
};

// Gives every parameter of `model` still on the meta device zero-filled storage as `how` says. A
// buffer on the meta device is refused (its value cannot be known): models keep none, or make them on
// their device. Parameters already materialised are left as they are.
void materialize(torch::nn::Module& model, const Materialization& how);

// Whether any parameter of `model` is on the meta device.
bool has_meta_parameters(const torch::nn::Module& model);

// Hands the WeightSink in scope a zero value of each meta parameter of `model` it wants (those `which`
// names; null: all): what train::materialize gives a parameter that nothing draws.
void give_zeros(const torch::nn::Module& model, const std::function<bool(const std::string& name)>& which = nullptr);

// The DeferredWeights of a model built lazily, each replay on a fresh description (`describe()`, on the
// meta device): `draw` gives it its initialisation, `load` (null: none) its starting weights.
template <typename Model>
DeferredWeights deferred_from(const torch::Device& device, std::function<Model()> describe, std::function<void(Model&)> draw,
                              std::function<void(Model&)> load = nullptr) {
  DeferredWeights weights;
  weights.device = device;
  weights.initialize = [describe, draw] {
    Model fresh = describe();
    draw(fresh);
  };
  if (load) {
    weights.load = [describe, load] {
      Model fresh = describe();
      load(fresh);
    };
  }
  return weights;
}

// The serial model's initialisation from `seed` (its initialize(), seeded first): the same draws on
// every rank and in every replay.
template <typename Model>
std::function<void(Model&)> seeded_initialization(uint64_t seed) {
  return [seed](Model& model) {
    torch::manual_seed(seed);
    model->initialize();
  };
}

}  // namespace kuafu::train

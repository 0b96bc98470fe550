// Where the values of a lazily described model's parameters go when nothing holds them yet. A model
// described on the meta device (core/train/lazy_model.h) whose trained weights a sharded strategy
// (ZeRO, Gemini) will lay into chunks is never materialised whole: its initialisation and its
// init_from load run with a WeightSink in scope, and each meta parameter's value (whole, or this rank's
// tensor-parallel block) is handed to the sink as it is drawn or read, then dropped. The strategy
// copies it into its chunk, so at most a chunk of float32 values exists beside what training keeps.
#pragma once

#include <torch/types.h>

#include <functional>
#include <string>

namespace kuafu {

// A sink that wants nothing only sets where values are drawn: the run's device, for parameters
// materialised in host memory (memory.offload_frozen) whose draws must equal an eager model's.
struct WeightSink {
  torch::Device device = torch::kCPU;  // where values are drawn (the run's device, so draws match eager ones)
  // Whether the sink takes parameter `name`'s value; one it does not take is still drawn (the random
  // generator moves on as in the eager model) but a load does not read it.
  std::function<bool(const std::string& name)> wants;
  std::function<void(const std::string& name, const torch::Tensor& value)> take;
};

namespace detail {
inline thread_local const WeightSink* current_weight_sink = nullptr;
}  // namespace detail

// The sink in scope on this thread, or null.
inline const WeightSink* current_weight_sink() { return detail::current_weight_sink; }

// Makes `sink` current until the end of the scope (scopes nest).
class ScopedWeightSink {
 public:
  explicit ScopedWeightSink(const WeightSink& sink) : previous_(detail::current_weight_sink) {
    detail::current_weight_sink = &sink;
  }
  ~ScopedWeightSink() { detail::current_weight_sink = previous_; }
  ScopedWeightSink(const ScopedWeightSink&) = delete;
  ScopedWeightSink& operator=(const ScopedWeightSink&) = delete;

 private:
  const WeightSink* previous_;
};

// Writes a loaded `value` into `parameter` (named `name` in its model), or, for a parameter still described on
// the meta device, hands it to the WeightSink in scope when that wants it (else drops it: another rank's).
inline void put_weight(const std::string& name, torch::Tensor& parameter, const torch::Tensor& value) {
  if (!parameter.is_meta()) {
    parameter.copy_(value);
  } else if (const WeightSink* sink = current_weight_sink(); sink && sink->wants(name)) {
    sink->take(name, value);
  }
}

// A model described on the meta device whose trained weights are filled later, by whoever lays them
// out (memory::ChunkedMasters), on `device` (the run's): `initialize` replays its initialisation from
// the run's seed, `load` its starting weights (model.init_from; null: none). Both deliver every meta
// parameter to the current WeightSink.
struct DeferredWeights {
  torch::Device device = torch::kCPU;
  std::function<void()> initialize = nullptr;
  std::function<void()> load = nullptr;
  explicit operator bool() const { return static_cast<bool>(initialize); }
};

}  // namespace kuafu

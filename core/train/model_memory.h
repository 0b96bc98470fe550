// A model too large for the machine is refused before it is built (building it would fill memory at
// hundreds of MB/s until the kernel kills the run, with no message), naming the keys that size it.
#pragma once

#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/train/runtime.h"

namespace kuafu::train {

// The least memory one rank needs for `parameters` model parameters: weights and gradients in the
// compute dtype, float32 masters (bf16/fp16) and optimizer state, this rank's share under tensor and
// pipeline parallelism and the memory strategy's sharding over the data ranks. Activations are not
// counted, so a run refused by it could never fit. Of them, `frozen` (a LoRA run's base model) cost only
// their weights in the compute dtype.
double least_training_bytes(const config::Config& config, const Runtime& runtime, double parameters, double frozen = 0);

// One model of a run of several, as the fit check counts it from its own section ([models.<name>.*]).
struct SizedModel {
  std::string name;
  double parameters = 0;
  double frozen = 0;     // of them, those that do not train (a LoRA base)
  bool trained = true;   // false: a frozen model, its weights alone in its compute dtype
  std::vector<std::string> keys = {};  // the settings that size it
};

// least_training_bytes summed over `models`, each from config.model_view(name): a trained model's
// weights, gradients, masters and optimizer state under its own strategy, a frozen one's weights in its
// own compute dtype (host memory under memory.offload_frozen, counted with the rest).
double least_run_bytes(const config::Config& config, const Runtime& runtime, const std::vector<SizedModel>& models);

// kuafu::Error naming `model_keys` (integer keys, with their values), the parameter count and the estimate when least_training_bytes
// (least_run_bytes of `models` when there are several) exceeds what the host (and the GPU, when the run
// has one) can still allocate.
void check_model_fits(const config::Config& config, const Runtime& runtime, double parameters,
                      const std::vector<std::string>& model_keys, double frozen = 0,
                      const std::vector<SizedModel>& models = {});

// kuafu::Error as check_model_fits's when the whole model's float32 weights (`parameters`), which
// evaluation, generation and export make on one process, exceed what the host (and `device`, when it is
// a GPU) can still allocate.
void check_weights_fit(const config::Config& config, const torch::Device& device, double parameters,
                       const std::vector<std::string>& model_keys);

// kuafu::Error "<what> needs at least X GiB, but this machine has Y available. <advice>" when `needed`
// bytes exceed what the host (and `device`, when it is a GPU) can still allocate (e.g. sampling's
// activations, which a request for a huge image would otherwise allocate until the kernel stops it).
void check_bytes_fit(double needed, const torch::Device& device, const std::string& what, const std::string& advice);

}  // namespace kuafu::train

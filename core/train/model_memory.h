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

// kuafu::Error naming `model_keys` (integer keys, with their values), the parameter count and the estimate when least_training_bytes
// exceeds what the host (and the GPU, when the run has one) can still allocate.
void check_model_fits(const config::Config& config, const Runtime& runtime, double parameters,
                      const std::vector<std::string>& model_keys, double frozen = 0);

}  // namespace kuafu::train

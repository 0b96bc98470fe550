#include "core/memory/memory_config.h"

namespace kuafu::memory {

void add_memory_schema(config::Schema& s) {
  s.add_string("memory.strategy", "none",
               "none: every data rank holds the whole model states; zero1: optimizer state and float32 masters "
               "sharded over the data ranks; zero2: gradients too")
      .choices({"none", "zero1", "zero2"});
  s.add_float("memory.chunk_mb", 0.0,
              "chunk size in MiB of the compute dtype (the unit ZeRO reduces and gathers); 0: the size up to 32 MiB "
              "that wastes least")
      .min(0.0);
}

std::optional<ZeroOptions> zero_options(const config::Config& config, torch::Dtype compute_dtype) {
  const std::string strategy = config.get_string("memory.strategy");
  if (strategy == "none") return std::nullopt;
  ZeroOptions options;
  options.stage = strategy == "zero1" ? 1 : 2;
  options.dtype = compute_dtype;
  options.chunk_numel =
      static_cast<int64_t>(config.get_float("memory.chunk_mb") * (1 << 20)) / torch::elementSize(compute_dtype);
  return options;
}

}  // namespace kuafu::memory

#include "core/memory/memory_config.h"

#include "core/memory/gemini.h"
#include "core/memory/zero.h"

namespace kuafu::memory {

void add_memory_schema(config::Schema& s) {
  s.add_string("memory.strategy", "none",
               "none: every data rank holds the whole model states; zero1: optimizer state and float32 masters "
               "sharded over the data ranks; zero2: gradients too; gemini: parameters too, in chunks gathered "
               "around each block (ZeRO-3)")
      .choices({"none", "zero1", "zero2", "gemini"});
  s.add_float("memory.chunk_mb", 0.0,
              "chunk size in MiB of the compute dtype (the unit ZeRO reduces and gathers); 0: the size up to 32 MiB "
              "that wastes least")
      .min(0.0);
}

std::unique_ptr<ChunkedMasters> make_sharded_states(const config::Config& config, torch::nn::Module& model,
                                                    const dist::GroupPtr& group, torch::Dtype compute_dtype) {
  const std::string strategy = config.get_string("memory.strategy");
  if (strategy == "none") return nullptr;
  const int64_t chunk_numel =
      static_cast<int64_t>(config.get_float("memory.chunk_mb") * (1 << 20)) / torch::elementSize(compute_dtype);
  if (strategy == "gemini") return std::make_unique<Gemini>(model, group, GeminiOptions{chunk_numel, compute_dtype});
  return std::make_unique<ZeroRedundancy>(model, group, ZeroOptions{strategy == "zero1" ? 1 : 2, chunk_numel, compute_dtype});
}

}  // namespace kuafu::memory

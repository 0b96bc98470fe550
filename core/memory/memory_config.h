// The memory.* config keys: which memory-saving strategy shards the model states over the data group.
#pragma once

#include <memory>
#include <optional>

#include "core/config/config.h"
#include "core/memory/chunked_masters.h"

namespace kuafu::memory {

void add_memory_schema(config::Schema& schema);

// The sharding `strategy` (memory.strategy as the caller read it: zero1, zero2, gemini) over `group`, with
// `model` cast to `compute_dtype`; null for "none" (plain data parallelism). `whole_gradients`: ZeRO keeps whole
// gradients through a step and reduces them once (stage 1), as a pipeline step needs. `deferred`: how
// trainable parameters left on the meta device (lazy construction) get their values. `disk` (Gemini only):
// the disk tier for the master chunks the host budget cannot hold, whose records keep `optimizer_slots`
// state tensors each.
std::unique_ptr<ChunkedMasters> make_sharded_states(const config::Config& config, const std::string& strategy,
                                                    torch::nn::Module& model, const dist::GroupPtr& group,
                                                    torch::Dtype compute_dtype, bool whole_gradients = false,
                                                    DeferredWeights deferred = {},
                                                    std::optional<DiskTierOptions> disk = std::nullopt,
                                                    int optimizer_slots = 0);

}  // namespace kuafu::memory

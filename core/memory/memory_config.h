// The memory.* config keys: which memory-saving strategy shards the model states over the data group.
#pragma once

#include <optional>

#include "core/config/config.h"
#include "core/memory/zero.h"

namespace kuafu::memory {

void add_memory_schema(config::Schema& schema);

// The ZeRO options memory.strategy asks for (zero1, zero2), or nullopt for plain data parallelism.
std::optional<ZeroOptions> zero_options(const config::Config& config, torch::Dtype compute_dtype);

}  // namespace kuafu::memory

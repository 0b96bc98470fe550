// How a run holds each of its models, read once per config: every part of a command that asks (the fit
// check, the recipe's builder, the model's ModelState or FrozenModel, the benchmark's line) gets the same
// reading of the model's own section (models.<name> over the top-level keys), so none can disagree.
#pragma once

#include <optional>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "core/config/config.h"

namespace kuafu::memory {
struct DiskTierOptions;  // core/memory/disk_tier.h
}  // namespace kuafu::memory

namespace kuafu::train {

struct HeldModel {
  std::string strategy;         // memory.strategy: none, zero1, zero2 or gemini
  bool offload_frozen = false;  // memory.offload_frozen
  std::string disk_dir;         // memory.disk_dir: the disk tier's folder ("": none)
  double disk_budget_gb = 0;    // memory.disk_budget_gb
  bool disk_read_ahead = true;  // memory.disk_read_ahead
  std::string precision;        // precision.dtype: fp32, bf16, fp16 or fp64
  // Whether a trained model's weights, gradients and optimizer state are sharded in chunks.
  bool sharded() const { return strategy != "none"; }
};

// Model `name`'s settings ("": the model `config` is a view of, or the config's one model).
const HeldModel& held_model(const config::Config& config, const std::string& name = "");

// Model `name`'s disk tier (memory.disk_dir): its offloaded frozen weights, or Gemini's master chunks; or none.
std::optional<memory::DiskTierOptions> disk_tier_options(const config::Config& config, const std::string& name = "");

// Model `name`'s compute dtype on `device` (its precision.dtype); fp16 on a CPU device fails at the key
// (LibTorch's CPU kernels lack it).
c10::ScalarType compute_dtype(const config::Config& config, const c10::Device& device, const std::string& name = "");

}  // namespace kuafu::train

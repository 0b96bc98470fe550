// LoRA from the config (lora.* keys) and PEFT's adapter folders: adapter_config.json and
// adapter_model.safetensors, the adapters named "base_model.model.<layer>.lora_A.weight" as
// PeftModel.save_pretrained writes them, so PeftModel.from_pretrained(base, folder) loads what Kuafu
// writes and Kuafu loads what PEFT writes.
#pragma once

#include <optional>
#include <string>

#include "core/config/cli.h"
#include "core/config/config.h"
#include "core/nn/lora.h"

namespace kuafu::train {

// A PEFT adapter folder's files, and the largest rank read (lora.rank's bound).
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";
inline constexpr int64_t kMaxLoraRank = 1 << 16;

// lora.rank (0: off), lora.alpha, lora.dropout, lora.targets (by default `targets`), lora.init_from.
void add_lora_schema(config::Schema& schema, const std::vector<std::string>& targets = {"q_proj", "v_proj"});
// export --adapter: a flag of the export command.
void add_adapter_option(config::CommandLine& cli);
// The config's LoRA, or nullopt when lora.rank = 0. kuafu::Error at the key for a bad value.
std::optional<nn::LoraSpec> lora_spec(const config::Config& config);

// Applies the config's LoRA to `model` (nothing when off) and, with lora.init_from, loads that
// adapter folder's weights. Returns whether LoRA is on. `adapters_on`: where the adapters are made
// (none: beside each adapted weight).
bool apply_configured_lora(const config::Config& config, torch::nn::Module& model,
                           std::optional<torch::Device> adapters_on = std::nullopt);

// The spec an adapter folder's adapter_config.json gives (a LoRA one with plain target names);
// kuafu::Error naming the file and key otherwise.
nn::LoraSpec read_adapter_config(const std::string& dir);
// Copies the folder's adapters into `model`, whose LoRA must be applied with the folder's spec:
// kuafu::Error naming the file and tensor for a missing, unexpected or mis-shaped adapter.
void load_adapter(torch::nn::Module& model, const std::string& dir);
struct AdapterFolderOptions {
  std::optional<std::string> task_type = "CAUSAL_LM";  // adapter_config.json's task_type; none (null) for a UNet
  std::vector<std::string> extra_files;                // copied in beside the adapter's files
};
// Writes a new adapter folder `dir` (an existing one is refused) with `model`'s adapters in float32.
// `base_model` goes into adapter_config.json's base_model_name_or_path.
void export_adapter(const torch::nn::Module& model, const nn::LoraSpec& spec, const std::string& dir,
                    const std::string& base_model, const AdapterFolderOptions& options = {});

}  // namespace kuafu::train

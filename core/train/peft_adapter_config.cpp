// Reading a PEFT adapter folder's adapter_config.json: apart from peft_adapter.cpp so that the parser is
// fuzzed without the models (fuzz/fuzz_adapter_config.cpp).
#include "core/train/peft_adapter.h"

#include <filesystem>

#include "core/io/hf_folder.h"
#include "core/io/json_file.h"

namespace kuafu::train {
namespace fs = std::filesystem;

nn::LoraSpec read_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kAdapterConfigFile).string();
  KUAFU_CHECK(fs::is_regular_file(path), dir, " is not a PEFT adapter folder: it has no ", kAdapterConfigFile);
  const nlohmann::json config = io::read_json_object(path);
  const std::string type = io::config_value<std::string>(config, "peft_type", "", path);
  KUAFU_CHECK(type == "LORA", path, ": \"peft_type\" is \"", type, "\"; Kuafu reads LoRA adapters only");
  nn::LoraSpec spec;
  spec.rank = io::config_required<int64_t>(config, "r", path);
  spec.alpha = io::config_value<double>(config, "lora_alpha", static_cast<double>(spec.rank), path);
  spec.dropout = io::config_value<double>(config, "lora_dropout", 0.0, path);
  KUAFU_CHECK(spec.rank > 0 && spec.rank <= kMaxLoraRank, path, ": \"r\" = ", spec.rank, " must be in [1, ", kMaxLoraRank,
              "] (the bounds of lora.rank)");
  // The bounds of lora.dropout (5 reached LibTorch's own "dropout probability has to be between 0 and 1").
  KUAFU_CHECK(spec.dropout >= 0.0 && spec.dropout <= 0.9, path, ": \"lora_dropout\" = ", spec.dropout,
              " must be in [0, 0.9] (the bounds of lora.dropout)");
  for (const char* variant : {"use_rslora", "use_dora"}) {
    KUAFU_CHECK(!io::config_value<bool>(config, variant, false, path), path, ": \"", variant, "\" is not supported");
  }
  for (const char* pattern : {"rank_pattern", "alpha_pattern"}) {
    const auto found = config.find(pattern);
    KUAFU_CHECK(found == config.end() || found->is_null() || found->empty(), path, ": \"", pattern,
                "\" (a rank or alpha per layer) is not supported");
  }
  const auto targets = config.find("target_modules");
  KUAFU_CHECK(targets != config.end() && targets->is_array() && !targets->empty(), path,
              ": \"target_modules\" must be a list of layer names (a regular expression is not supported)");
  spec.targets.clear();
  for (const auto& target : *targets) {
    KUAFU_CHECK(target.is_string(), path, ": \"target_modules\" holds ", target.dump(), ", not a name");
    spec.targets.push_back(target.get<std::string>());
  }
  // The stored adapters agree with r before any is built (an "r" of 30,000,000 allocated gigabytes first).
  if (const fs::path weights = fs::path(dir) / kAdapterWeightsFile; fs::is_regular_file(weights)) {
    for (const auto& [name, tensor] : io::load_safetensors(weights.string()).tensors) {
      const bool a = name.find(".lora_A") != std::string::npos, b = name.find(".lora_B") != std::string::npos;
      if (!a && !b) continue;
      KUAFU_CHECK(tensor.dim() == 2 && tensor.size(a ? 0 : 1) == spec.rank, weights.string(), ": '", name, "' has shape ",
                  tensor.sizes(), ", which does not fit \"r\" = ", spec.rank, " of ", path);
    }
  }
  return spec;
}

}  // namespace kuafu::train

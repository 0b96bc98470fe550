#include "core/train/peft_adapter.h"

#include <filesystem>

#include "core/io/hf_folder.h"
#include "core/io/json_file.h"
#include "core/util/logging.h"
#include "core/util/text.h"

namespace kuafu::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrefix = "base_model.model.";  // PeftModel around the model
constexpr const char* kConfigFile = kAdapterConfigFile;
constexpr const char* kWeightsFile = kAdapterWeightsFile;
constexpr int64_t kMaxRank = kMaxLoraRank;

io::NamedTensors adapters_of(const torch::nn::Module& model) {
  io::NamedTensors out;
  for (const auto& item : model.named_parameters()) {
    if (nn::is_lora_parameter(item.key())) out.emplace_back(item.key(), item.value());
  }
  return out;
}

}  // namespace

void add_adapter_option(config::CommandLine& cli) {
  cli.flag("export", "adapter", "write only the LoRA adapters, as PEFT's adapter_config.json + adapter_model.safetensors");
}

void add_lora_schema(config::Schema& s, const std::vector<std::string>& targets) {
  s.add_int("lora.rank", 0, "LoRA rank r; 0 = off (every weight trains)").min(0).max(kMaxRank);
  s.add_float("lora.alpha", 16.0, "LoRA scale numerator: the adapters' output is multiplied by alpha / r").min(0);
  s.add_float("lora.dropout", 0.0, "dropout on the adapters' input").min(0).max(0.9);
  s.add_string_list("lora.targets", targets,
                    "layers that get adapters: a layer's path or its last parts (PEFT's target_modules)");
  s.add_string("lora.init_from", "", "a PEFT adapter folder to start the adapters from (its r, alpha and targets)");
}

std::optional<nn::LoraSpec> lora_spec(const config::Config& config) {
  const std::string init = config.get_string("lora.init_from");
  if (!init.empty()) {
    if (!fs::is_regular_file(fs::path(init) / kConfigFile)) {
      config.fail_at("lora.init_from", "= " + init + " is not an adapter folder (no " + kConfigFile + ")");
    }
    nn::LoraSpec spec = read_adapter_config(init);
    if (config.is_set("lora.dropout")) spec.dropout = config.get_float("lora.dropout");
    return spec;
  }
  if (config.get_int("lora.rank") == 0) return std::nullopt;
  nn::LoraSpec spec;
  spec.rank = config.get_int("lora.rank");
  spec.alpha = config.get_float("lora.alpha");
  spec.dropout = config.get_float("lora.dropout");
  spec.targets = config.get_string_list("lora.targets");
  if (spec.targets.empty()) config.fail_at("lora.targets", "is empty; name the layers to adapt, e.g. [\"q_proj\", \"v_proj\"]");
  return spec;
}

bool apply_configured_lora(const config::Config& config, torch::nn::Module& model,
                           std::optional<torch::Device> adapters_on) {
  std::optional<nn::LoraSpec> spec = lora_spec(config);
  if (!spec) return false;
  spec->device = adapters_on;
  const std::vector<std::string> adapted = nn::apply_lora(model, *spec);
  int64_t trainable = 0, total = 0;
  for (const auto& p : model.parameters()) {
    total += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  log::infof("LoRA r = ", spec->rank, ", alpha = ", spec->alpha, " on ", adapted.size(), " layers: ", trainable,
             " of ", total, " parameters train (", 100.0 * static_cast<double>(trainable) / static_cast<double>(total), "%)");
  if (const std::string init = config.get_string("lora.init_from"); !init.empty()) load_adapter(model, init);
  return true;
}

void load_adapter(torch::nn::Module& model, const std::string& dir) {
  const std::string file = (fs::path(dir) / kWeightsFile).string();
  KUAFU_CHECK(fs::is_regular_file(file), dir, " has no ", kWeightsFile);
  io::HfFolder folder;
  folder.path = dir;
  auto header = std::make_shared<const io::SafetensorsIndex>(io::read_safetensors_index(file));
  for (const auto& entry : header->entries) folder.tensors.push_back({entry.name, file, header, &entry});
  io::load_hf_weights(folder, adapters_of(model), [](const std::string& stored) -> std::optional<std::string> {
    std::string name = text::starts_with(stored, kPrefix) ? stored.substr(std::string(kPrefix).size()) : stored;
    // PEFT keeps its adapter name in memory ("lora_A.default.weight") and drops it when saving.
    const std::string adapter_name = ".default";
    for (const std::string part : {".lora_A", ".lora_B"}) {
      if (const size_t at = name.find(part + adapter_name + "."); at != std::string::npos) {
        name.erase(at + part.size(), adapter_name.size());
      }
    }
    return name;
  });
}

void export_adapter(const torch::nn::Module& model, const nn::LoraSpec& spec, const std::string& dir,
                    const std::string& base_model, const AdapterFolderOptions& folder) {
  io::NamedTensors tensors;
  for (const auto& [name, tensor] : adapters_of(model)) tensors.emplace_back(kPrefix + name, tensor.detach().to(torch::kFloat32));
  KUAFU_CHECK(!tensors.empty(), "the model has no LoRA adapters to export (lora.rank = 0)");
  const nlohmann::json config = {{"peft_type", "LORA"},
                                 {"task_type", folder.task_type ? nlohmann::json(*folder.task_type) : nlohmann::json()},
                                 {"r", spec.rank},
                                 {"lora_alpha", spec.alpha},
                                 {"lora_dropout", spec.dropout},
                                 {"target_modules", spec.targets},
                                 {"bias", "none"},
                                 {"fan_in_fan_out", nn::adapts_in_out_layers(model)},
                                 {"use_rslora", false},
                                 {"init_lora_weights", true},
                                 {"inference_mode", true},
                                 {"modules_to_save", nullptr},
                                 {"base_model_name_or_path", base_model}};
  io::HfWriteOptions options;
  options.config_file = kConfigFile;
  options.weights_stem = "adapter_model";
  options.extra_files = folder.extra_files;
  io::write_hf_folder(dir, config, tensors, options);
}

}  // namespace kuafu::train

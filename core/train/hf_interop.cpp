#include "core/train/hf_interop.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "core/train/checkpoint.h"

namespace kuafu::train {

void add_hf_schema(config::Schema& s) {
  s.add_string("model.init_from", "",
               "a Hugging Face model folder (config.json + safetensors) to start from: its config gives the "
               "model's shape, its weights the initial ones (a resumed run takes its checkpoint's)");
  s.add_float("export.max_shard_mb", 5120, "`export` cuts the weights into files of at most this size").min(1);
}

std::string init_from(const config::Config& config) {
  const std::string dir = config.get_string("model.init_from");
  if (!dir.empty() && !std::filesystem::exists(std::filesystem::path(dir) / "config.json")) {
    config.fail_at("model.init_from", "= " + dir + " is not a Hugging Face model folder (no config.json there)");
  }
  return dir;
}

void check_agrees_with_folder(const config::Config& config, const std::map<std::string, double>& from_folder,
                              const std::vector<std::string>& may_differ) {
  for (const auto& [key, folder_value] : from_folder) {
    if (!config.is_set(key) || std::find(may_differ.begin(), may_differ.end(), key) != may_differ.end()) continue;
    const bool integer = config.schema().find(key)->type() == config::Type::kInt;
    const double value = integer ? static_cast<double>(config.get_int(key)) : config.get_float(key);
    if (value != folder_value) {
      std::ostringstream shown;
      shown << folder_value;
      config.fail_at(key, "disagrees with model.init_from = " + config.get_string("model.init_from") +
                              ", whose config.json has " + shown.str() + "; remove the key or make it agree");
    }
  }
}

io::HfWriteOptions export_options(const config::Config& config) {
  io::HfWriteOptions options;
  options.max_shard_bytes = static_cast<int64_t>(config.get_float("export.max_shard_mb") * (1 << 20));
  return options;
}

void load_pretrained(torch::nn::Module& model, const parallel::TensorParallel& tp, const io::HfFolder& folder,
                     const io::StoredToModel& to_model, const io::MayStay& may_stay) {
  // The serial model's full tensors, filled from the folder (float32 on the host), then each rank
  // keeps its block of them.
  io::NamedTensors full;
  parallel::initialize_like_serial(model, tp, [&](const std::string& name, torch::Tensor& tensor) {
    full.emplace_back(name, torch::empty(tensor.sizes(), torch::kFloat32));
    return false;
  });
  const std::set<std::string> filled = io::load_hf_weights(folder, full, to_model, may_stay);
  std::map<std::string, torch::Tensor> by_name(full.begin(), full.end());
  parallel::initialize_like_serial(model, tp, [&](const std::string& name, torch::Tensor& tensor) {
    if (!filled.count(name)) return false;  // a tensor `may_stay` let keep its initial values
    tensor.copy_(by_name.at(name));
    return true;
  });
}

void check_tied_copy(const io::HfFolder& folder, const std::string& head, const std::vector<std::string>& embedding_names) {
  const io::HfTensor* copy = folder.find(head);
  if (!copy) return;
  const io::HfTensor* embedding = nullptr;
  for (const std::string& name : embedding_names) {
    if (!embedding) embedding = folder.find(name);
  }
  KUAFU_CHECK(embedding && torch::equal(copy->tensor, embedding->tensor), copy->file, ": ", head, " differs from ",
              embedding_names.front(), "; the model ties them");
}

void export_pretrained(const torch::nn::Module& model, const parallel::TensorParallel& tp, const std::string& dir,
                       const nlohmann::json& config, const io::HfWriteOptions& options) {
  KUAFU_CHECK(!tp.enabled(), "export takes the whole (serial) model");
  io::NamedTensors tensors;
  for (const auto& [name, tensor] : named_weights(model)) tensors.emplace_back(name, tensor.detach().to(torch::kFloat32));
  io::write_hf_folder(dir, config, tensors, options);
}

}  // namespace kuafu::train

#include "core/io/hf_folder.h"

#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "core/io/json_file.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::io {
namespace fs = std::filesystem;

namespace {

// transformers' weight files, then diffusers' (a pipeline component's: unet/, vae/, text_encoder/ ...).
constexpr const char* kStems[] = {"model", "diffusion_pytorch_model"};

std::string shape_text(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

// The shard files an index names, in the order they first appear, each checked to stay in the folder.
std::vector<std::string> shards_of(const fs::path& index_path, const nlohmann::json& index) {
  KUAFU_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), index_path.string(),
              ": expected an object with a \"weight_map\" object of tensor name -> shard file");
  std::vector<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    KUAFU_CHECK(file.is_string(), index_path.string(), ": weight_map[\"", text::abbreviate(name), "\"] must be a file name");
    const std::string shard = file.get<std::string>();
    KUAFU_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..", index_path.string(),
                ": weight_map[\"", text::abbreviate(name), "\"] = \"", text::abbreviate(shard),
                "\" is not a file name in this folder");
    if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
  }
  return shards;
}

}  // namespace

torch::Tensor HfTensor::read() const { return read_tensor(*index, *entry); }

const HfTensor* HfFolder::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

nlohmann::json read_hf_config(const std::string& dir) {
  const fs::path root = dir;
  KUAFU_CHECK(fs::is_directory(root), "model folder ", dir, (fs::exists(root) ? " is not a folder" : " does not exist"));
  const fs::path config_path = root / "config.json";
  KUAFU_CHECK(fs::exists(config_path), dir, " has no config.json (not a Hugging Face model folder)");
  nlohmann::json config = read_json_file(config_path.string());
  KUAFU_CHECK(config.is_object(), config_path.string(), ": expected a JSON object");
  return config;
}

std::vector<int64_t> generation_eos_ids(const std::string& dir) {
  const fs::path path = fs::path(dir) / "generation_config.json";
  if (!fs::exists(path)) return {};
  const nlohmann::json config = read_json_file(path.string());
  KUAFU_CHECK(config.is_object(), path.string(), ": expected a JSON object");
  if (!config.contains("eos_token_id") || config["eos_token_id"].is_null()) return {};
  const nlohmann::json& eos = config["eos_token_id"];
  const nlohmann::json ids = eos.is_array() ? eos : nlohmann::json::array({eos});
  std::vector<int64_t> out;
  for (const nlohmann::json& id : ids) {
    KUAFU_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, path.string(),
                ": eos_token_id must be a token id or a list of them, got ", eos.dump());
    out.push_back(id.get<int64_t>());
  }
  return out;
}

HfFolder read_hf_folder(const std::string& dir) {
  const fs::path root = dir;
  HfFolder folder;
  folder.path = dir;
  folder.config = read_hf_config(dir);

  std::vector<std::string> files;
  nlohmann::json index;
  fs::path index_path;
  for (const std::string stem : kStems) {
    if (fs::exists(root / (stem + ".safetensors.index.json"))) {
      index_path = root / (stem + ".safetensors.index.json");
      index = read_json_file(index_path.string());
      files = shards_of(index_path, index);
      break;
    }
    if (fs::exists(root / (stem + ".safetensors"))) {
      files = {stem + ".safetensors"};
      break;
    }
  }
  if (files.empty()) {
    const bool pickle = fs::exists(root / "pytorch_model.bin") || fs::exists(root / "pytorch_model.bin.index.json") ||
                        fs::exists(root / "diffusion_pytorch_model.bin");
    fail(dir + " has no model.safetensors (or diffusion_pytorch_model.safetensors), nor an index of shards" +
         (pickle ? ": its weights are PyTorch pickles (*.bin), which Kuafu does not read; convert them with "
                   "transformers or diffusers: from_pretrained(dir).save_pretrained(new_dir)"
                 : ""));
  }
  std::map<std::string, std::string> file_of;  // tensor -> file, to refuse a tensor stored twice
  for (const std::string& file : files) {
    const fs::path path = root / file;
    KUAFU_CHECK(fs::exists(path), index_path, " names shard ", file, ", which is not in ", dir);
    auto header = std::make_shared<const SafetensorsIndex>(read_safetensors_index(path.string()));
    for (const SafetensorsEntry& entry : header->entries) {
      const auto [where, inserted] = file_of.emplace(entry.name, file);
      KUAFU_CHECK(inserted, dir, ": tensor '", text::abbreviate(entry.name), "' is stored twice, in ", where->second,
                  " and ", file);
      folder.tensors.push_back({entry.name, path.string(), header, &entry});
    }
  }
  if (!index.is_null()) {
    for (const auto& [name, file] : index["weight_map"].items()) {
      const auto found = file_of.find(name);
      KUAFU_CHECK(found != file_of.end() && found->second == file.get<std::string>(), index_path.string(),
                  ": maps tensor '", text::abbreviate(name), "' to ", file.get<std::string>(), ", which does not hold it");
    }
  }
  return folder;
}

std::set<std::string> load_hf_weights(const HfFolder& folder, const HfTargets& model, const StoredToModel& to_model,
                                      const MayStay& may_stay) {
  std::map<std::string, std::string> filled_by;  // model name -> stored name
  torch::NoGradGuard no_grad;
  for (const HfTensor& stored : folder.tensors) {
    const std::optional<std::string> name = to_model(stored.name);
    if (!name) continue;
    const std::string where = stored.file + ": tensor '" + text::abbreviate(stored.name) + "'";
    const auto target = model.find(*name);
    KUAFU_CHECK(target != model.end(), where, " is not part of this model (read as '", text::abbreviate(*name),
                "'); is the folder's model_type the one this app trains?");
    const auto [previous, first] = filled_by.emplace(*name, stored.name);
    KUAFU_CHECK(first, where, " and tensor '", previous->second, "' both load into '", *name, "'");
    KUAFU_CHECK(stored.shape() == target->second.shape, where, " has shape ", shape_text(stored.shape()),
                " but the model's '", *name, "' has ", shape_text(target->second.shape),
                " (does config.json match the weights?)");
    if (!target->second.fill) continue;  // another rank holds it
    // [shape] or the target's part of it, one at a time
    const torch::Tensor tensor = target->second.read ? target->second.read(stored) : stored.read();
    check_loadable(stored.file, stored.name, tensor, target->second.dtype);
    target->second.fill(tensor);
  }
  std::vector<std::string> missing;
  for (const auto& [name, target] : model) {
    if (!filled_by.count(name) && !(may_stay && may_stay(name))) missing.push_back(name);
  }
  if (!missing.empty()) {
    std::string listed;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) listed += (i ? ", '" : "'") + missing[i] + "'";
    if (missing.size() > 5) listed += " and " + std::to_string(missing.size() - 5) + " more";
    fail(folder.path + " lacks " + std::to_string(missing.size()) + " of the model's tensors: " + listed);
  }
  std::set<std::string> filled;
  for (const auto& [name, stored] : filled_by) filled.insert(name);
  return filled;
}

std::set<std::string> load_hf_weights(const HfFolder& folder, const NamedTensors& model, const StoredToModel& to_model,
                                      const MayStay& may_stay) {
  HfTargets targets;
  for (const auto& [name, tensor] : model) {
    torch::Tensor into = tensor;
    HfTarget& target = targets[name];
    target.shape = tensor.sizes().vec();
    target.dtype = tensor.scalar_type();
    target.fill = [into](const torch::Tensor& stored) mutable { into.copy_(stored); };
  }
  return load_hf_weights(folder, targets, to_model, may_stay);
}

std::vector<std::string> hf_tokenizer_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const char* name : {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                           "generation_config.json"}) {
    const std::filesystem::path path = std::filesystem::path(dir) / name;
    if (std::filesystem::is_regular_file(path)) files.push_back(path.string());
  }
  return files;
}

namespace {

// The folder's files into `building`: shards, index, config, extra files.
void write_into(const fs::path& building, const nlohmann::json& config, const NamedTensors& tensors,
                const HfWriteOptions& options) {
  std::error_code error;

  // Shards in the tensors' order, each as full as the limit allows (a tensor above it alone in one).
  std::vector<NamedTensors> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& [name, tensor] : tensors) {
    const int64_t bytes = tensor.numel() * static_cast<int64_t>(tensor.element_size());
    if (in_shard > 0 && in_shard + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().emplace_back(name, tensor);
    in_shard += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};  // transformers checks it
  if (shards.size() == 1) {
    save_safetensors((building / (options.weights_stem + ".safetensors")).string(), shards[0], metadata);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    auto five_digits = [](size_t n) {
      std::string digits = std::to_string(n);
      return std::string(5 - std::min<size_t>(5, digits.size()), '0') + digits;
    };
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string file = options.weights_stem + "-" + five_digits(i + 1) + "-of-" + five_digits(shards.size()) + ".safetensors";
      save_safetensors((building / file).string(), shards[i], metadata);
      for (const auto& [name, tensor] : shards[i]) weight_map[name] = file;
    }
    const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic((building / (options.weights_stem + ".safetensors.index.json")).string(), index.dump(2) + "\n");
  }
  write_file_atomic((building / options.config_file).string(), config.dump(2) + "\n");
  for (const std::string& file : options.extra_files) {
    fs::copy_file(file, building / fs::path(file).filename(), error);
    KUAFU_CHECK(!error, "cannot copy ", file, " into ", building.string(), ": ", error.message());
    fsync_path((building / fs::path(file).filename()).string());
  }
}

}  // namespace

void write_hf_folder(const std::string& dir, const nlohmann::json& config, const NamedTensors& tensors,
                     const HfWriteOptions& options) {
  KUAFU_CHECK(options.max_shard_bytes > 0, "the shard size must be positive");
  for (const std::string& file : options.extra_files) KUAFU_CHECK(fs::is_regular_file(file), "cannot copy ", file, ": no such file");
  write_folder_atomic(dir, [&](const fs::path& building) { write_into(building, config, tensors, options); });
}

}  // namespace kuafu::io

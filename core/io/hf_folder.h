// Hugging Face model folders as save_pretrained writes and from_pretrained reads them: config.json,
// the weights in safetensors (model.safetensors, or shards that model.safetensors.index.json lists),
// and the tokenizer's files beside them. What a model's tensors are called there is the model's
// business: a loader maps each stored name to its own (or skips it).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "core/io/safetensors.h"
#include "core/util/error.h"

namespace kuafu::io {

// One stored tensor, read from its file only when asked (a folder of a large model is never held whole).
struct HfTensor {
  std::string name;  // as stored (a loader may rename it, e.g. older attention names)
  std::string file;  // the safetensors file that holds it, for messages
  std::shared_ptr<const SafetensorsIndex> index;  // that file's header
  const SafetensorsEntry* entry = nullptr;        // this tensor's place in it
  const std::vector<int64_t>& shape() const { return entry->shape; }
  torch::Tensor read() const;  // a fresh CPU tensor, as stored (dtype included)
};

struct HfFolder {
  std::string path;
  nlohmann::json config;  // config.json
  std::vector<HfTensor> tensors;
  const HfTensor* find(const std::string& name) const;
};

// config.json alone (kuafu::Error naming the folder or file when missing or malformed).
nlohmann::json read_hf_config(const std::string& dir);
// generation_config.json's eos_token_id (one id or a list) in `dir`; empty when the file or the key is
// absent. kuafu::Error naming the file when it is malformed or an id is not a non-negative integer.
std::vector<int64_t> generation_eos_ids(const std::string& dir);

// Reads config.json and every weight file's header (the tensors are read one at a time, by
// HfTensor::read or load_hf_weights). kuafu::Error naming the folder, file or tensor for: no
// folder, no config.json or malformed JSON, no safetensors weights (a PyTorch pickle alone gets a note
// on converting it), an index that names a missing shard or a tensor its shard lacks, a tensor stored
// twice, and every problem load_safetensors finds in a file.
HfFolder read_hf_folder(const std::string& dir);

// The model's name for a stored tensor, or nullopt to leave it out (a tied copy, an old buffer).
using StoredToModel = std::function<std::optional<std::string>(const std::string& stored)>;

// A config.json value: `key` as T, or `fallback` when it is absent or null; kuafu::Error naming `where`
// (the file) and the key when it has another type.
template <typename T>
T config_value(const nlohmann::json& config, const std::string& key, T fallback, const std::string& where) {
  const auto found = config.find(key);
  if (found == config.end() || found->is_null()) return fallback;
  // A count must be written as one: converting 1e30 to an integer is undefined behaviour (shown through
  // fuzz_hf_config), and 2.5 would be cut to 2 without a word.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (found->is_number_float()) throw Error(where + ": \"" + key + "\" = " + found->dump() + " must be a whole number");
  }
  try {
    return found->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(where + ": \"" + key + "\" = " + found->dump() + " has the wrong type");
  }
}
// The same for a key the model cannot do without.
template <typename T>
T config_required(const nlohmann::json& config, const std::string& key, const std::string& where) {
  if (!config.contains(key) || config[key].is_null()) throw Error(where + ": \"" + key + "\" is missing");
  return config_value<T>(config, key, T{}, where);
}

// Model tensors that may keep their initial values when the folder has nothing for them (a new head).
using MayStay = std::function<bool(const std::string& model_name)>;

// A model tensor a folder fills: the whole (serial) shape and the dtype it is held in, what of the
// stored tensor to read (`read`; null: all of it, as stored) and what takes that (`fill`): a
// tensor-parallel rank reads and keeps only its block. No `fill`: the tensor is held by another rank (a
// pipeline stage's) and is not read at all.
struct HfTarget {
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat32;
  std::function<torch::Tensor(const HfTensor& stored)> read;
  std::function<void(const torch::Tensor& read)> fill;
};
using HfTargets = std::map<std::string, HfTarget>;

// Fills `model`'s tensors by name from the folder's through `to_model`, reading one stored tensor (or
// the part of it a target reads) at a time and converting among the floating widths. kuafu::Error naming the file and tensor for a stored
// tensor that maps to no model tensor, two that map to the same one, a shape or dtype that does not
// fit; and naming the model tensors that nothing filled (unless `may_stay` allows it). Returns the names
// it filled.
std::set<std::string> load_hf_weights(const HfFolder& folder, const HfTargets& model, const StoredToModel& to_model,
                                      const MayStay& may_stay = nullptr);
// The same into whole tensors, copied in place.
std::set<std::string> load_hf_weights(const HfFolder& folder, const NamedTensors& model, const StoredToModel& to_model,
                                      const MayStay& may_stay = nullptr);

struct HfWriteOptions {
  int64_t max_shard_bytes = int64_t{5} << 30;  // above it the weights are cut into shards plus an index
  std::vector<std::string> extra_files;        // copied in beside the weights (tokenizer files)
  // A model folder's names; a PEFT adapter folder has adapter_config.json and adapter_model.safetensors.
  std::string config_file = "config.json";
  std::string weights_stem = "model";  // <stem>.safetensors, or <stem>-0000i-of-0000n.safetensors + index
};

// The Hugging Face files beside the weights that `dir` holds (vocab.json, merges.txt, tokenizer.json, their
// configs, the chat template, generation_config.json), to travel with an export so the folder is a whole model.
std::vector<std::string> hf_tokenizer_files(const std::string& dir);

// Writes a new folder `dir`: config.json, the tensors (one file, or shards model-0000i-of-0000n and the
// index) and the extra files. It is built under a temporary name and renamed into place; an existing
// `dir` is refused, so nothing saved before is ever overwritten.
void write_hf_folder(const std::string& dir, const nlohmann::json& config, const NamedTensors& tensors,
                     const HfWriteOptions& options = {});

}  // namespace kuafu::io

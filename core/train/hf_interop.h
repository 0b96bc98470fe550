// What every app shares of Hugging Face interop: the keys (model.init_from to start from a folder,
// export.max_shard_mb for exports) and starting a model from a folder's weights whatever its
// tensor-parallel layout: each stored tensor is mapped to the model's name, checked
// (io::load_hf_weights: missing, unexpected, shape, dtype) against the serial model's full shape, and
// cut into this rank's block.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/io/hf_folder.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::train {

// model.init_from and export.max_shard_mb.
void add_hf_schema(config::Schema& schema);
// The folder model.init_from names ("" when none); kuafu::Error at the key when it is not a folder
// with a config.json.
std::string init_from(const config::Config& config);
// The folder's config.json gives the model's shape: a model.* key the config sets must agree with the
// folder's value (`from_folder`, by key), except `may_differ` (dropout, which a fine-tune may change);
// kuafu::Error at the first key that disagrees.
void check_agrees_with_folder(const config::Config& config, const std::map<std::string, double>& from_folder,
                              const std::vector<std::string>& may_differ);
io::HfWriteOptions export_options(const config::Config& config);

// Tensors that `may_stay` allows and the folder lacks keep their values (e.g. a new classifier head).
void load_pretrained(torch::nn::Module& model, const parallel::TensorParallel& tp, const io::HfFolder& folder,
                     const io::StoredToModel& to_model, const io::MayStay& may_stay = nullptr);

// A tied output layer a folder stores as a copy (`head`, e.g. "lm_head.weight") must equal the
// embedding it is tied to, stored under the first of `embedding_names` the folder has: otherwise the
// copy, which the model drops, would differ from what it keeps. kuafu::Error naming the file.
void check_tied_copy(const io::HfFolder& folder, const std::string& head, const std::vector<std::string>& embedding_names);

// Writes the whole (serial) `model`'s parameters and buffers in float32 as a new folder `dir` with `config`.
void export_pretrained(const torch::nn::Module& model, const parallel::TensorParallel& tp, const std::string& dir,
                       const nlohmann::json& config, const io::HfWriteOptions& options);

}  // namespace kuafu::train

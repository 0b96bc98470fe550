// What every app shares of Hugging Face interop: the keys (model.init_from to start from a folder,
// export.max_shard_mb for exports), loading a folder's weights onto any layout through a table of
// names, and exporting. hf_config_table.h holds the config.json side.
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
io::HfWriteOptions export_options(const config::Config& config);

// How a Hugging Face class's stored tensor names map onto the model's: a table, not code per app.
struct HfWeightNames {
  std::string prefix;                       // the model's names begin so; a bare base model's files lack it
  std::vector<std::string> own_prefixes;    // stored names kept as they are (a head beside the base)
  std::vector<std::string> dropped_prefixes, dropped_suffixes;  // (after `prefix`) tensors the model lacks
  std::string tied_head;       // a stored copy of the embedding the model keeps once ("lm_head.weight")
  std::string tied_embedding;  // the model's name for that embedding; the copy must equal it
  // Model tensors the folder may lack, which keep their initial values (a new head).
  std::vector<std::string> fresh_prefixes = {};
};

// Starts `model` from `folder`'s weights whatever its tensor-parallel layout: each stored tensor is
// named as `names` says, checked (io::load_hf_weights: missing, unexpected, shape, dtype) against the
// serial model's full shape, and cut into this rank's block. kuafu::Error naming the file when a tied
// copy differs from its embedding.
void load_pretrained(torch::nn::Module& model, const parallel::TensorParallel& tp, const io::HfFolder& folder,
                     const HfWeightNames& names);

// Writes the whole (serial) `model`'s parameters and buffers in float32 as a new folder `dir` with `config`.
void export_pretrained(const torch::nn::Module& model, const parallel::TensorParallel& tp, const std::string& dir,
                       const nlohmann::json& config, const io::HfWriteOptions& options);

}  // namespace kuafu::train

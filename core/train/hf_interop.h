// What every app shares of Hugging Face interop: the keys (model.init_from to start from a folder,
// export.max_shard_mb for exports) and starting a model from a folder's weights whatever its
// tensor-parallel layout: each stored tensor is mapped to the model's name, checked
// (io::load_hf_weights: missing, unexpected, shape, dtype) against the serial model's full shape, and
// cut into this rank's block.
#pragma once

#include <string>

#include "core/config/config.h"
#include "core/io/hf_folder.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::train {

// model.init_from and export.max_shard_mb.
void add_hf_schema(config::Schema& schema);
// The folder model.init_from names ("" when none); kuafu::Error at the key when it is not a folder
// with a config.json.
std::string init_from(const config::Config& config);
// Refuses model.* keys set beside model.init_from (the folder's config.json gives the shape), except
// `allowed` (e.g. dropout, which a fine-tune may change).
void check_shape_from_folder(const config::Config& config, const std::vector<std::string>& allowed);
io::HfWriteOptions export_options(const config::Config& config);

// Tensors that `may_stay` allows and the folder lacks keep their values (e.g. a new classifier head).
void load_pretrained(torch::nn::Module& model, const parallel::TensorParallel& tp, const io::HfFolder& folder,
                     const io::StoredToModel& to_model, const io::MayStay& may_stay = nullptr);

}  // namespace kuafu::train

// ViT as Hugging Face folders hold it (ViTForImageClassification): config.json <-> ViTConfig, the
// weights under the same names, and the export from_pretrained loads. A backbone-only folder (ViTModel,
// or another number of labels) starts a fine-tune with a fresh classifier when the caller allows it.
#pragma once

#include <string>
#include <vector>

#include "apps/vit/model.h"
#include "core/train/hf_model_format.h"

namespace kuafu::vit {

using VitFormat = train::HfModelFormat<ViTForImageClassification, ViTConfig>;

// Reading a config.json refuses, naming the file and the key, what Kuafu's ViT does not compute
// (another model_type, an activation other than exact GELU, no q/k/v bias, patches that do not tile the
// image). num_labels comes from id2label (transformers' own rule).
const VitFormat& vit_format();

// `class_names` (empty: LABEL_i) become id2label / label2id.
nlohmann::json hf_config(const ViTConfig& config, const std::vector<std::string>& class_names = {});

// `folder`'s weights into `model` (any tensor-parallel layout). With `fresh_classifier` the folder's
// classifier (absent in a ViTModel folder, or another shape) is ignored and the model's kept.
void load_hf_weights(ViTForImageClassification& model, const io::HfFolder& folder, bool fresh_classifier = false);

void export_hf_vit(ViTForImageClassification& model, const std::string& dir,
                   const std::vector<std::string>& class_names = {}, const io::HfWriteOptions& options = {});

}  // namespace kuafu::vit

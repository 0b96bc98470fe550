// Textual-inversion embeddings as people share them, added to a pipeline at sample time and written by
// `export`: diffusers' learned_embeds.safetensors ({token: [n, D]}, what textual_inversion.py writes and
// load_textual_inversion reads), A1111's {"emb_params": [n, D]} (named by its file), and SDXL's
// {"clip_l": [n, D1], "clip_g": [n, D2]} (the first and second text encoder's rows).
#pragma once

#include <string>

#include "apps/stable_diffusion/pipeline.h"
#include "core/io/safetensors.h"

namespace kuafu::sd {

// The file `export` writes for a textual-inversion run.
inline constexpr const char* kLearnedEmbedsFile = "learned_embeds.safetensors";

// Adds concept `token` to `pipeline`: its tokens to the tokenizer(s) (PromptTokenizer::add_concept) and its
// rows [n, D1] (SDXL: and [n, D2]) after the text encoders' added rows, in their dtype and on their device.
// kuafu::Error naming the token for rows that do not fit the encoders.
void add_concept(Pipeline& pipeline, const std::string& token, const torch::Tensor& rows, const torch::Tensor& rows_2 = {});

// Reads an embedding file into `pipeline` as concept `token` (empty: diffusers' file's one key, else the
// file's name without its extension, as A1111 names an embedding). Returns the token. kuafu::Error naming the
// file for a layout other than the three above or one the pipeline cannot take (SDXL needs clip_l and clip_g).
std::string load_textual_inversion(Pipeline& pipeline, const std::string& path, std::string token = "");

// A concept's file tensors, float32 on the CPU: {token: rows} for SD 1.x/2.x (no rows_2), {"clip_l": rows,
// "clip_g": rows_2} for SDXL.
io::NamedTensors textual_inversion_tensors(const std::string& token, const torch::Tensor& rows, const torch::Tensor& rows_2 = {});

}  // namespace kuafu::sd

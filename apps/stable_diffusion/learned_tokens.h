// Textual inversion's trained weights: a new concept's token embeddings, one row per vector, in the text
// encoder (and SDXL's second). The text encoders read them for ids past their vocabulary
// (ClipTextModelImpl::forward's added rows); nothing else of the pipeline changes.
#pragma once

#include <torch/torch.h>

namespace kuafu::sd {

struct LearnedTokensImpl : torch::nn::Module {
  // hidden_2 = 0: no second encoder (SD 1.x and 2.x). Uninitialised rows; on torch::kMeta described only.
  LearnedTokensImpl(int64_t vectors, int64_t hidden, int64_t hidden_2, const torch::Device& device);
  torch::Tensor rows;    // "rows" [n, D1]
  torch::Tensor rows_2;  // "rows_2" [n, D2] (SDXL), else undefined
};
TORCH_MODULE(LearnedTokens);

}  // namespace kuafu::sd

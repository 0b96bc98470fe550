#include "apps/stable_diffusion/learned_tokens.h"

namespace kuafu::sd {

LearnedTokensImpl::LearnedTokensImpl(int64_t vectors, int64_t hidden, int64_t hidden_2, const torch::Device& device) {
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  rows = register_parameter("rows", torch::empty({vectors, hidden}, options));
  if (hidden_2 > 0) rows_2 = register_parameter("rows_2", torch::empty({vectors, hidden_2}, options));
}

}  // namespace kuafu::sd

// Rotary position embeddings (RoPE) as the Llama family computes them in transformers: each head's
// features [x1 | x2] (halves, not interleaved pairs) rotated by angles position x inverse frequency,
// with the frequency schedules a config.json's rope_parameters name: "default", "linear" (positions
// divided by a factor), "dynamic" (NTK: the base grown with the longest position of the call) and
// "llama3" (long wavelengths divided by a factor, a smooth ramp between). The frequencies are computed
// in float32 exactly as transformers computes them, so the angles agree to the last bit.
#pragma once

#include <string>
#include <utility>

#include <torch/types.h>

namespace kuafu::nn {

struct RotarySpec {
  int64_t head_dim = 0;  // the features each head rotates (all of them)
  double theta = 10000.0;
  std::string type = "default";  // default | linear | dynamic | llama3
  double factor = 1.0;           // linear, dynamic, llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_positions = 0;  // llama3: the pre-training context
  int64_t max_positions = 0;           // dynamic: the context the base is grown past
};

// kuafu::Error naming the field (prefixed by `where`) for a type Kuafu does not compute or a bad value.
void validate(const RotarySpec& spec, const std::string& where);

// Inverse frequencies [head_dim / 2] (float32) for a call whose longest position is `longest` (only
// "dynamic" reads it: it grows the base once longest + 1 exceeds max_positions).
torch::Tensor inverse_frequencies(const RotarySpec& spec, int64_t longest, const torch::Device& device);

// cos and sin [B or 1, T, head_dim] of positions [B or 1, T] (int64), in `dtype` (computed in float32).
std::pair<torch::Tensor, torch::Tensor> rotary_angles(const RotarySpec& spec, const torch::Tensor& positions, torch::Dtype dtype);

// x [B, T, h, head_dim] rotated by cos, sin [B or 1, T, head_dim].
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace kuafu::nn

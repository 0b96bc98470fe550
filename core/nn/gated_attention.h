// Multi-head attention as AlphaFold 2 writes it (supplement Algorithm 7 and the attention inside
// Algorithms 8, 10, 13, 14 and 19): queries from one input, keys and values from another, logits
// q·k/√c plus any number of additive biases (a pair bias, a mask), a sigmoid gate from the query input,
// and an output projection. The parameters keep AlphaFold's layout and names, so its .npz files map
// onto them one to one. It can run in chunks along the first batch axis: the same result, the
// logits of one chunk at a time (inference at lengths whose whole logits would not fit). Biased logits
// are clipped to ±1e8 (a fully masked query row: the values' mean, no gradient), as AlphaFold 2.3 does.
#pragma once

#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace kuafu::nn {

struct GatedAttentionSpec {
  int64_t query_width = 0;   // c_q, the query input's channels
  int64_t key_width = 0;     // c_kv, the key/value input's channels (0: query_width)
  int64_t heads = 1;         // H
  int64_t head_width = 0;    // c per head
  int64_t output_width = 0;  // 0: query_width
  bool gated = true;         // AlphaFold's gating (every Evoformer attention; IPA has none)
};

struct GatedAttentionImpl : torch::nn::Module {
  // Parameters on `options`' device and dtype, at zero until initialize().
  explicit GatedAttentionImpl(const GatedAttentionSpec& spec, const torch::TensorOptions& options = {});

  // queries [*, Q, c_q]; keys_values [*, K, c_kv] (the same leading axes); each bias broadcastable to
  // [*, H, Q, K]. `chunk` > 0: that many entries of the first leading axis at a time. -> [*, Q, out].
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys_values,
                        const std::vector<torch::Tensor>& biases = {}, int64_t chunk = 0);

  // AlphaFold's initial values: query, key and value weights Glorot-uniform, the gate's weights zero and
  // bias one (open), the output projection zero when `zero_output` (its "final" layers), else Glorot.
  void initialize(bool zero_output = true);
  // The same for one parameter (`name`, e.g. "key_w") into `value` (its shape), as nn::initialize_by_module
  // asks: the draws of initialize() when taken in parameter order.
  void initial_value(const std::string& name, torch::Tensor& value, bool zero_output = true) const;

  GatedAttentionSpec spec;
  torch::Tensor query_w, key_w, value_w;  // [c_q or c_kv, H, c]
  torch::Tensor gating_w, gating_b;       // [c_q, H, c], [H, c] (gated)
  torch::Tensor output_w, output_b;       // [H, c, out], [out]

 private:
  torch::Tensor attend(const torch::Tensor& queries, const torch::Tensor& keys_values, const std::vector<torch::Tensor>& biases);
};
TORCH_MODULE(GatedAttention);

// Haiku's "glorot" (variance scaling 1, fan average, uniform), in place, for a weight of the given fans.
void glorot_uniform(torch::Tensor& w, int64_t fan_in, int64_t fan_out);

// The bias `bias` (broadcastable to [*, H, Q, K], where `leading` = the number of * axes) restricted to
// entries [start, start + length) of the first leading axis, or itself where it broadcasts along it.
torch::Tensor leading_slice(const torch::Tensor& bias, int64_t leading, int64_t start, int64_t length);

}  // namespace kuafu::nn

// AlphaFold 2's structure module (supplement 1.8), maths only: invariant point attention so far. Shapes:
// the single representation s [R, c_s], the pair z [R, R, c_z], each residue's frame (Rigid, [R]).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "apps/fastfold/evoformer.h"
#include "apps/fastfold/rigid.h"

namespace kuafu::fold {

struct IpaSizes {
  int64_t single_channels = 384;  // c_s (AlphaFold's num_channel)
  int64_t pair_channels = 128;    // c_z
  int64_t heads = 12;
  int64_t scalar_qk = 16, scalar_v = 16;  // per head
  int64_t point_qk = 4, point_v = 8;      // per head
};

// Algorithm 22: attention whose logits add scalar q·k, the pair's bias and the (learned-weight) squared
// distances between query and key points placed in the global frame by each residue's frame, so the
// result is invariant to a global motion; outputs scalar values, points brought back into the query's
// frame and their norms, and the attention-weighted pair, projected to c_s.
struct InvariantPointAttentionImpl : torch::nn::Module {
  explicit InvariantPointAttentionImpl(const IpaSizes& sizes);
  // s [R, c_s], z [R, R, c_z], frames [R], mask [R] -> [R, c_s].
  torch::Tensor forward(const torch::Tensor& s, const torch::Tensor& z, const Rigid& frames, const torch::Tensor& mask);
  IpaSizes sizes;
  AfLinear q_scalar{nullptr}, kv_scalar{nullptr}, q_point_local{nullptr}, kv_point_local{nullptr};
  AfLinear attention_2d{nullptr}, output_projection{nullptr};
  torch::Tensor trainable_point_weights;  // [H], through softplus
};
TORCH_MODULE(InvariantPointAttention);

}  // namespace kuafu::fold

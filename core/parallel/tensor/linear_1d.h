// 1D (Megatron-style) tensor-parallel linear layers over one mesh axis of P ranks. A column-parallel
// layer followed by a row-parallel one needs one all-reduce forward and one backward.
#pragma once

#include "core/parallel/tensor/layout.h"

namespace kuafu::parallel {

// Weight storage: GPT-2's Conv1D keeps [in, out]; torch::nn::Linear (and OPT, ViT) keep [out, in].
enum class WeightOrder { kInOut, kOutIn };

struct LinearSpec {
  int64_t in = 0, out = 0;
  bool bias = true;
  WeightOrder order = WeightOrder::kOutIn;
  // Segments cut separately: the output features of a column-parallel layer (3 for a fused q|k|v
  // projection), the input features of a row-parallel one (to take such an output as it comes).
  int64_t stride = 1;
};

// Y = X A + b, A = [A_1 ... A_P] split by output columns (b likewise): rank r computes Y_r = X A_r + b_r.
// X is replicated; its gradient is the sum of every rank's contribution (all-reduce in backward).
// Output: [..., out / P], this rank's columns.
class ColumnParallelLinearImpl : public torch::nn::Module, public ShardedModule {
 public:
  ColumnParallelLinearImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh, std::string axis = "tensor");
  torch::Tensor forward(const torch::Tensor& x);
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // [in, out/P] or [out/P, in]
  torch::Tensor bias;    // [out/P] (undefined without bias)

 private:
  LinearSpec spec_;
  std::string axis_;
  dist::GroupPtr group_;
};
TORCH_MODULE(ColumnParallelLinear);

// Y = X A + b, A = [A_1; ...; A_P] split by input rows: X arrives split along its last dimension (from a
// column-parallel layer), rank r computes X_r A_r and the partial products are summed over the ranks
// (all-reduce in forward, identity in backward). b is replicated and added once, after the sum.
class RowParallelLinearImpl : public torch::nn::Module, public ShardedModule {
 public:
  RowParallelLinearImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh, std::string axis = "tensor");
  torch::Tensor forward(const torch::Tensor& x);  // [..., in/P] -> [..., out], replicated
  std::map<std::string, Layout> parameter_layouts() const override;

  torch::Tensor weight;  // [in/P, out] or [out, in/P]
  torch::Tensor bias;    // [out], replicated

 private:
  LinearSpec spec_;
  std::string axis_;
  dist::GroupPtr group_;
};
TORCH_MODULE(RowParallelLinear);

}  // namespace kuafu::parallel

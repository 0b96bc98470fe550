// AlphaFold 2's output heads (supplement 1.9.6, 1.9.8, 1.9.9, 1.9.10), maths only.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "apps/fastfold/evoformer.h"
#include "apps/fastfold/residue_types.h"

namespace kuafu::fold {

// The distogram: logits over distance bins for each residue pair, symmetric. z [R, R, c_z] -> [R, R, bins]
// in the head's dtype (z may come in another: a bf16 trunk's), its rows in chunks of `chunk_size` (0: whole).
struct DistogramHeadImpl : torch::nn::Module {
  DistogramHeadImpl(int64_t pair_channels, int64_t bins, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& z, int64_t chunk_size = 0);
  AfLinear half_logits{nullptr};
};
TORCH_MODULE(DistogramHead);

// The masked MSA: logits over the 23 MSA classes at each position. m [S, R, c_m] -> [S, R, classes].
struct MaskedMsaHeadImpl : torch::nn::Module {
  MaskedMsaHeadImpl(int64_t msa_channels, int64_t classes, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& m) { return logits(m); }
  AfLinear logits{nullptr};
};
TORCH_MODULE(MaskedMsaHead);

// Algorithm 29: per-residue lDDT-Cα bins from the structure module's single representation.
// s [R, c_s] -> [R, bins].
struct PlddtHeadImpl : torch::nn::Module {
  PlddtHeadImpl(int64_t single_channels, int64_t hidden, int64_t bins, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& s);
  AfLayerNorm input_layer_norm{nullptr};
  AfLinear act_0{nullptr}, act_1{nullptr}, logits{nullptr};
};
TORCH_MODULE(PlddtHead);

// 1.9.10: for each residue and each of the 37 atom types, the logit that the experiment resolved that atom,
// from the Evoformer's single representation (AlphaFold's fine-tuning stage trains it). s [R, c_s] -> [R, 37].
struct ExperimentallyResolvedHeadImpl : torch::nn::Module {
  ExperimentallyResolvedHeadImpl(int64_t single_channels, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& s) { return logits(s); }
  AfLinear logits{nullptr};
};
TORCH_MODULE(ExperimentallyResolvedHead);

// The expected lDDT-Cα in [0, 100] of pLDDT logits [*, bins] (bin centres).
torch::Tensor plddt_of_logits(const torch::Tensor& logits);

}  // namespace kuafu::fold

// Losses over preference pairs, per pair [B]: the reward model's Bradley–Terry loss and DPO's.
#pragma once

#include <torch/torch.h>

#include <string>

namespace kuafu::chat {

// −log σ(r_chosen − r_rejected − margin): the reward model's pairwise loss (margin 0 unless a pair says
// how much better its chosen answer is).
torch::Tensor pairwise_loss(const torch::Tensor& chosen, const torch::Tensor& rejected, double margin = 0);

// Direct preference optimisation on sequence log-probabilities [B] of the policy and of the frozen
// reference, h = (log π_c − log π_ref,c) − (log π_r − log π_ref,r):
//   Sigmoid (Rafailov et al., 2023): −log σ(β h);
//   Ipo (Azar et al., 2023): (h − 1/(2β))², where with `chosen_tokens` and `rejected_tokens` [B] (each
//   completion's learned tokens) each side's ratio is its mean over them, as trl 1.16 computes IPO so that
//   β means the same at every length; without them, the sums (the paper's sequence log-probabilities).
enum class PreferenceLoss { Sigmoid, Ipo };
PreferenceLoss preference_loss_named(const std::string& name);  // "sigmoid", "ipo"
torch::Tensor dpo_loss(const torch::Tensor& policy_chosen, const torch::Tensor& policy_rejected,
                       const torch::Tensor& ref_chosen, const torch::Tensor& ref_rejected, double beta,
                       PreferenceLoss loss = PreferenceLoss::Sigmoid, const torch::Tensor& chosen_tokens = {},
                       const torch::Tensor& rejected_tokens = {});

}  // namespace kuafu::chat

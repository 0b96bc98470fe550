#include "apps/chat_rlhf/preference_losses.h"

#include "core/util/error.h"

namespace kuafu::chat {

torch::Tensor pairwise_loss(const torch::Tensor& chosen, const torch::Tensor& rejected, double margin) {
  // log σ computed as −softplus(−x): no overflow for a large negative difference.
  return torch::softplus(-(chosen - rejected - margin));
}

PreferenceLoss preference_loss_named(const std::string& name) {
  if (name == "sigmoid") return PreferenceLoss::Sigmoid;
  if (name == "ipo") return PreferenceLoss::Ipo;
  throw Error("the preference loss must be \"sigmoid\" or \"ipo\", got \"" + name + "\"");
}

torch::Tensor dpo_loss(const torch::Tensor& policy_chosen, const torch::Tensor& policy_rejected,
                       const torch::Tensor& ref_chosen, const torch::Tensor& ref_rejected, double beta,
                       PreferenceLoss loss, const torch::Tensor& chosen_tokens, const torch::Tensor& rejected_tokens) {
  KUAFU_CHECK(beta > 0, "DPO's beta must be > 0, got ", beta);
  KUAFU_CHECK(chosen_tokens.defined() == rejected_tokens.defined(), "dpo_loss: token counts for both sides or neither");
  torch::Tensor chosen = policy_chosen - ref_chosen.detach(), rejected = policy_rejected - ref_rejected.detach();  // [B]
  if (loss == PreferenceLoss::Ipo) {
    if (chosen_tokens.defined()) {
      chosen = chosen / chosen_tokens.to(chosen.scalar_type()).clamp_min(1.0);
      rejected = rejected / rejected_tokens.to(rejected.scalar_type()).clamp_min(1.0);
    }
    return (chosen - rejected - 1.0 / (2.0 * beta)).square();
  }
  return torch::softplus(-beta * (chosen - rejected));
}

}  // namespace kuafu::chat

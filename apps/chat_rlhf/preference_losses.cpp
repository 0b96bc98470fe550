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
                       PreferenceLoss loss) {
  KUAFU_CHECK(beta > 0, "DPO's beta must be > 0, got ", beta);
  const torch::Tensor h = (policy_chosen - ref_chosen.detach()) - (policy_rejected - ref_rejected.detach());
  if (loss == PreferenceLoss::Ipo) return (h - 1.0 / (2.0 * beta)).square();
  return torch::softplus(-beta * h);
}

}  // namespace kuafu::chat

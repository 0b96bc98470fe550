#include "apps/chat_rlhf/dpo_stage.h"

#include <sstream>

#include "apps/chat_rlhf/policy.h"
#include "apps/chat_rlhf/preference_losses.h"
#include "apps/opt_finetune/commands.h"
#include "apps/opt_finetune/task.h"
#include "core/nn/dropout.h"
#include "core/train/frozen_model.h"
#include "core/train/hf_interop.h"
#include "core/util/logging.h"

namespace kuafu::chat {

DpoTask::DpoTask(nn::CausalLMPtr policy, nn::CausalLMPtr reference, std::shared_ptr<const PreferenceSet> train,
                 std::shared_ptr<const PreferenceSet> val, const train::TrainSettings& settings, const DpoSettings& dpo,
                 int64_t pad_id, const torch::Device& device)
    // The FLOPs of the policy's forward and backward; the reference's forward runs once per pair.
    : PairTask(train, val, settings, pad_id, device, static_cast<double>(opt::shape_of(*policy).parameter_count())),
      policy_(std::move(policy)), reference_(std::move(reference)), train_cache_(train->pairs.size()),
      val_cache_(val->pairs.size()), dpo_(dpo) {
  train::freeze(reference_->module());
}

std::vector<train::RunModel> DpoTask::frozen_models() {
  // Its blocks take hooks for its frozen weights' offload.
  return {train::frozen_run_model("reference", reference_->module(), reference_.get())};
}

std::pair<torch::Tensor, torch::Tensor> DpoTask::logprob_sums(const PairRows& batch, const PreferenceSet& set,
                                                              std::vector<torch::Tensor>& cache) {
  const torch::Tensor policy = learned_logprob_sums(*policy_, batch.tokens, batch.real, batch.learned);  // [2n]
  const int64_t n = batch.count();
  std::vector<size_t> missing;
  for (size_t p : batch.pairs) {
    if (!cache[p].defined()) missing.push_back(p);
  }
  if (!missing.empty()) {
    torch::NoGradGuard no_grad;
    const PairRows rows = pair_rows(set, missing, pad_id(), device());
    const torch::Tensor sums = learned_logprob_sums(*reference_, rows.tokens, rows.real, rows.learned).to(torch::kFloat64).cpu();
    const auto m = static_cast<int64_t>(missing.size());
    for (int64_t i = 0; i < m; ++i) cache[missing[static_cast<size_t>(i)]] = torch::stack({sums[i], sums[m + i]});
  }
  torch::Tensor reference = torch::empty({2 * n}, torch::kFloat64);
  for (int64_t i = 0; i < n; ++i) {
    reference[i] = cache[batch.pairs[static_cast<size_t>(i)]][0];
    reference[n + i] = cache[batch.pairs[static_cast<size_t>(i)]][1];
  }
  return {policy, reference.to(policy.device()).to(policy.scalar_type())};
}

torch::Tensor DpoTask::pair_losses(const torch::Tensor& policy, const torch::Tensor& reference, const PairRows& batch) const {
  const int64_t n = batch.count();
  torch::Tensor chosen_tokens, rejected_tokens;
  if (dpo_.loss == PreferenceLoss::Ipo && dpo_.ipo_per_token) {
    const torch::Tensor tokens = batch.learned.sum(1).to(policy.device());  // [2n]
    chosen_tokens = tokens.narrow(0, 0, n);
    rejected_tokens = tokens.narrow(0, n, n);
  }
  return dpo_loss(policy.narrow(0, 0, n), policy.narrow(0, n, n), reference.narrow(0, 0, n), reference.narrow(0, n, n),
                  dpo_.beta, dpo_.loss, chosen_tokens, rejected_tokens);
}

torch::Tensor DpoTask::loss(int64_t step, int64_t first_row, int64_t rows) {
  policy_->module().train();
  const PairRows batch = train_pairs(step, first_row, rows);
  const auto [policy, reference] = logprob_sums(batch, train_set(), train_cache_);
  return pair_losses(policy, reference, batch).to(torch::kFloat32).mean();
}

train::LossSum DpoTask::evaluate(int rank, int ranks) {
  torch::NoGradGuard no_grad;
  policy_->module().eval();
  train::LossSum sums;
  sums.extra.assign(3, 0.0);
  for_each_eval_batch(rank, ranks, [&](const PairRows& batch) {
    const int64_t n = batch.count();
    const auto [policy, reference] = logprob_sums(batch, val_set(), val_cache_);
    const torch::Tensor p = policy.to(torch::kFloat64).cpu(), r = reference.to(torch::kFloat64).cpu();
    const torch::Tensor h = (p.narrow(0, 0, n) - r.narrow(0, 0, n)) - (p.narrow(0, n, n) - r.narrow(0, n, n));
    sums.loss_sum += pair_losses(p, r, batch).sum().item<double>();
    sums.count += static_cast<double>(n);
    sums.correct += (h > 0).sum().item<double>();
    sums.extra[0] += dpo_.beta * h.sum().item<double>();
    sums.extra[1] += p.narrow(0, 0, n).sum().item<double>();
    sums.extra[2] += (p.narrow(0, 0, n) > p.narrow(0, n, n)).sum().item<double>();
  });
  return sums;
}

std::vector<train::EvalMetric> DpoTask::eval_metrics(const train::LossSum& sums) const {
  const double pairs = std::max(1.0, sums.count);
  return {{"val_accuracy", "preference accuracy", sums.correct / pairs, true},
          {"val_margin", "reward margin", sums.extra[0] / pairs, false},
          {"val_chosen_logprob", "chosen log-prob", sums.extra[1] / pairs, false},
          // The policy's own ranking, which the SFT model has too (its implicit reward is 0 everywhere).
          {"val_likelihood_accuracy", "likelihood ranks chosen first", sums.extra[2] / pairs, true}};
}

namespace {

// DPO's policy is OPT fine-tuning's model (full or LoRA), declared by kuafu-opt: its building, export,
// generation and benchmark are kuafu-opt's; the task and its figures are DPO's.
class DpoApp : public opt::CausalLmApp {
 public:
  explicit DpoApp(const config::Config& config) : CausalLmApp(config), dpo_(dpo_settings(config)) {}

  // The policy as kuafu-opt counts it, and the frozen reference in its own section's dtype.
  train::ModelSize model_size() override {
    return train::size_of({train::sized(recipe()), train::sized(reference_recipe(reference()))});
  }
  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override {
    require_data_parallel(config_, runtime, options, Stage::Dpo);
    const ChatText text = chat_text(config_, settings_.data, settings_.model);
    auto train = read_preference_file(config_, "data.train", settings_.data.train, text);
    auto val = read_preference_file(config_, "data.val", settings_.data.val, text);
    // Training: the policy as kuafu-opt trains it (its LoRA base in the compute dtype, or left described
    // for ZeRO and Gemini), the frozen reference as its section holds it (its compute dtype; in host
    // memory under memory.offload_frozen). An evaluation (no runtime): both whole in float32, as it runs them.
    const train::Purpose purpose = runtime ? train::Purpose::train : train::Purpose::evaluate;
    train::Built<nn::CausalLMPtr> policy = train::build(recipe(), config_, {purpose, options});
    if (dpo_.disable_dropout) nn::disable_dropout(policy.model->module());
    const ReferenceFolder folder = reference();
    const nn::CausalLMPtr frozen = train::build(reference_recipe(folder), config_, {purpose, options}).model;
    check_same_tokens(config_, folder.key, folder.folder, *frozen, *policy.model, "the policy", *text.tokenizer);
    auto task = std::make_unique<DpoTask>(policy.model, frozen, train, val, settings_.train, dpo_, text.pad_id, options.device);
    task->defer_weights(std::move(policy.deferred));
    return task;
  }
  std::string describe(train::RunTask&) override {
    std::ostringstream line;
    line << "DPO (" << (dpo_.loss == PreferenceLoss::Ipo ? "IPO" : "sigmoid") << ", beta " << dpo_.beta << ") on "
         << settings_.model.describe();
    return line.str();
  }
 private:
  ReferenceFolder reference() const { return reference_folder(config_, "dpo.reference", dpo_.reference); }

  DpoSettings dpo_;
};

}  // namespace

std::unique_ptr<train::App> make_dpo_app(const config::Config& config) { return std::make_unique<DpoApp>(config); }

}  // namespace kuafu::chat

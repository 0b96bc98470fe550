#include "apps/chat_rlhf/reward_stage.h"

#include <sstream>

#include "apps/chat_rlhf/preference_losses.h"
#include "core/train/benchmark.h"
#include "core/train/hf_interop.h"
#include "core/train/model_app.h"
#include "core/util/logging.h"

namespace kuafu::chat {

RewardTask::RewardTask(ScoredModel model, std::shared_ptr<const PreferenceSet> train, std::shared_ptr<const PreferenceSet> val,
                       const train::TrainSettings& settings, double margin, int64_t pad_id, const torch::Device& device)
    : PairTask(std::move(train), std::move(val), settings, pad_id, device, static_cast<double>(model->shape.parameter_count())),
      model_(std::move(model)), margin_(margin) {}

torch::Tensor RewardTask::loss(int64_t step, int64_t first_row, int64_t rows) {
  model_->train();
  const PairRows batch = train_pairs(step, first_row, rows);
  const torch::Tensor scores = model_->scores(batch.tokens, batch.real).to(torch::kFloat32);  // [2n]: chosen, then rejected
  return pairwise_loss(scores.narrow(0, 0, rows), scores.narrow(0, rows, rows), margin_).mean();
}

train::LossSum RewardTask::evaluate(int rank, int ranks) {
  torch::NoGradGuard no_grad;
  model_->eval();
  const auto kinds = static_cast<int64_t>(val_set().kinds.size());
  train::LossSum sums;
  sums.extra.assign(static_cast<size_t>(1 + 2 * kinds), 0.0);
  for_each_eval_batch(rank, ranks, [&](const PairRows& batch) {
    const int64_t n = batch.count();
    const torch::Tensor scores = model_->scores(batch.tokens, batch.real).to(torch::kFloat64).cpu();
    const torch::Tensor margin = scores.narrow(0, 0, n) - scores.narrow(0, n, n);
    sums.loss_sum += pairwise_loss(scores.narrow(0, 0, n), scores.narrow(0, n, n), margin_).sum().item<double>();
    sums.count += static_cast<double>(n);
    sums.extra[0] += margin.sum().item<double>();
    for (int64_t i = 0; i < n; ++i) {
      const bool right = margin[i].item<double>() > 0;
      sums.correct += right ? 1 : 0;
      const auto kind = static_cast<size_t>(batch.kinds[static_cast<size_t>(i)]);
      sums.extra[1 + kind] += right ? 1 : 0;
      sums.extra[1 + static_cast<size_t>(kinds) + kind] += 1;
    }
  });
  return sums;
}

std::vector<train::EvalMetric> RewardTask::eval_metrics(const train::LossSum& sums) const {
  const double pairs = std::max(1.0, sums.count);
  std::vector<train::EvalMetric> metrics = {{"val_accuracy", "pairwise accuracy", sums.correct / pairs, true},
                                            {"val_margin", "mean margin", sums.extra[0] / pairs, false}};
  const std::vector<std::string>& names = val_set().kinds;
  const size_t kinds = names.size();
  for (size_t k = 0; k < kinds; ++k) {
    if (names[k].empty() || sums.extra[1 + kinds + k] == 0) continue;
    metrics.push_back({"val_accuracy_" + names[k], names[k], sums.extra[1 + k] / sums.extra[1 + kinds + k], true});
  }
  return metrics;
}

namespace {

// The reward model: train.seed's draws, then model.init_from's weights when it names a folder (an SFT
// model's decoder, the head keeping its draws, or a reward model's folder whole).
train::ModelRecipe<ScoredModel> reward_model_recipe(const config::Config& config, const opt::OptSettings& settings) {
  train::ModelRecipe<ScoredModel> recipe;
  recipe.describe = train::described<ScoredModel>(settings.model);
  recipe.draw = train::seeded_initialization<ScoredModel>(settings.train.seed);
  recipe.load = train::init_from_load<ScoredModel>(config, [](ScoredModel& model, const std::string& folder) {
    load_scored_weights(model, folder);
  });
  recipe.parameters = static_cast<double>(settings.model.parameter_count());
  recipe.size_keys = {"model.hidden_size", "model.num_hidden_layers"};
  return recipe;
}

class RewardApp : public train::ModelApp<ScoredModel> {
 public:
  explicit RewardApp(const config::Config& config)
      : ModelApp(config), settings_(opt::read_settings(config)), reward_(reward_settings(config)) {}

  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override {
    require_data_parallel(config_, runtime, options, Stage::Reward);
    const ChatText text = chat_text(config_, settings_.data, settings_.model);
    auto train = read_preference_file(config_, "data.train", settings_.data.train, text);
    auto val = read_preference_file(config_, "data.val", settings_.data.val, text);
    // Left described under ZeRO and Gemini when training; whole in float32 for an evaluation.
    train::Built<ScoredModel> built =
        train::build(recipe(), config_, {runtime ? train::Purpose::train : train::Purpose::evaluate, options});
    auto task = std::make_unique<RewardTask>(built.model, train, val, settings_.train, reward_.margin, text.pad_id, options.device);
    task->defer_weights(std::move(built.deferred));
    return task;
  }
  std::string describe(train::RunTask&) override {
    return "reward model, a scalar head on " + settings_.model.describe();
  }  nlohmann::json export_model(const std::string& out, io::HfWriteOptions options, const config::ParsedCommand&) override {
    if (!settings_.data.tokenizer.empty()) options.extra_files = io::hf_tokenizer_files(settings_.data.tokenizer);
    save_scored_model(model(), out, options);
    return {{"architecture", settings_.model.classifier_architecture()}};
  }
  nlohmann::json benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) override {
    const int64_t rows = settings_.train.micro_batch_size, context = settings_.data.context;
    ScoredModel& model = this->model();
    const torch::Tensor tokens = torch::randint(0, settings_.model.vocab_size(), {2 * rows, context},
                                                torch::TensorOptions(torch::kInt64).device(runtime.device));
    const torch::Tensor real = torch::ones_like(tokens, torch::kBool);
    train::BenchmarkSpec spec;
    spec.app = "chat-rm";
    spec.item_name = "tokens";
    spec.items_per_row = 2 * context;  // a row of the benchmark is a pair
    spec.flops_per_item = 6.0 * static_cast<double>(settings_.model.parameter_count());
    spec.parameters = settings_.model.parameter_count();
    spec.fields = {{"context", context}};
    spec.deferred = deferred();
    return train::benchmark_training(config_, runtime, *model, [&] {
      const torch::Tensor scores = model->scores(tokens, real).to(torch::kFloat32);
      return pairwise_loss(scores.narrow(0, 0, rows), scores.narrow(0, rows, rows)).mean();
    }, rows, spec, memory);
  }

 private:
  train::ModelRecipe<ScoredModel> recipe() const override { return reward_model_recipe(config_, settings_); }

  opt::OptSettings settings_;
  RewardSettings reward_;
};

}  // namespace

std::unique_ptr<train::App> make_reward_app(const config::Config& config) { return std::make_unique<RewardApp>(config); }

}  // namespace kuafu::chat

#include "core/train/trainer.h"

#include <chrono>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "core/dist/collectives.h"
#include "core/memory/memory_config.h"
#include "core/memory/memory_meter.h"
#include "core/optim/optim_config.h"
#include "core/train/step_loop.h"
#include "core/util/device.h"
#include "core/util/logging.h"

namespace kuafu::train {

void add_trainer_schema(config::Schema& s) {
  add_train_schema(s);
  optim::add_optimizer_schema(s);
  optim::add_precision_schema(s);
  memory::add_memory_schema(s);
}

void add_model_sections(config::Schema& schema, const std::vector<std::string>& models) {
  schema.add_model_sections(models, {"optim", "precision", "memory"});
}

double RunTask::pipeline_step(int64_t, const std::vector<int64_t>&, int64_t, double) {
  fail("this task does not run a pipeline schedule");
}

std::map<std::string, torch::Tensor> RunTask::further_losses(int pass, int64_t, int64_t, int64_t) {
  fail(detail::concat("this task gives no losses for backward pass ", pass));
}

bool TrainTask::set_block_hooks(hooks::BlockHooks* /*hooks*/) { return false; }

RunModel trained_run_model(std::string name, hooks::SiteModel& model, DeferredWeights deferred) {
  RunModel trained;
  trained.name = std::move(name);
  trained.module = &model.module();
  trained.set_block_hooks = hooks_through_sites(model);
  trained.deferred = std::move(deferred);
  return trained;
}

RunModel frozen_run_model(std::string name, torch::nn::Module& module, hooks::SiteModel* sites) {
  RunModel frozen;
  frozen.name = std::move(name);
  frozen.module = &module;
  frozen.trained = frozen.saved = false;
  if (sites) frozen.set_block_hooks = hooks_through_sites(*sites);
  return frozen;
}

std::vector<RunModel> TrainTask::models() {
  RunModel one;
  one.module = &model();
  one.set_block_hooks = [this](hooks::BlockHooks* hooks) { return set_block_hooks(hooks); };
  one.tied = tied_copies();
  one.deferred = deferred_weights();
  std::vector<RunModel> all = {one};
  for (RunModel& frozen : frozen_models()) all.push_back(std::move(frozen));
  return all;
}

std::map<std::string, torch::Tensor> TrainTask::losses(int64_t step, int64_t first_row, int64_t rows) {
  return {{"", loss(step, first_row, rows)}};
}

Trainer::Trainer(const config::Config& config, Runtime& runtime, RunTask& task)
    : config_(config), runtime_(runtime), task_(task), settings_(read_train_settings(config)) {
  run_ = std::make_unique<RunFolder>(config, runtime, settings_, task.checkpoint_keys());
  accumulation_ = accumulation_steps(config, runtime);
  models_ = task.models();
  for (const RunModel& model : models_) {
    KUAFU_CHECK(model.module, "model ", model.name, " of the task has no module");
    views_.push_back(model.name.empty() ? config : config.model_view(model.name));
    const config::Config& view = views_.back();
    if (!model.trained) {
      frozen_.push_back(std::make_unique<FrozenModel>(view, runtime, *model.module,
                                                      FrozenModelOptions{model.name, model.saved, model.set_block_hooks}));
      continue;
    }
    ModelStateOptions options;
    options.name = model.name;
    options.steps = settings_.steps;
    options.tied = model.tied;
    options.set_block_hooks = model.set_block_hooks;
    options.deferred = model.deferred;
    trained_.push_back({model.name, std::make_unique<ModelState>(view, runtime, *model.module, std::move(options))});
  }
  KUAFU_CHECK(!trained_.empty(), "the task trains none of its models");
  KUAFU_CHECK(!task.pipelined() || (trained_.size() == 1 && frozen_.empty()), "a pipelined task trains one model");
  if (const std::optional<Resume> resume = run_->checkpoint_to_resume()) {
    for (Trained& t : trained_) t.state->load(resume->folder, resume->trainer_state);
    for (auto& f : frozen_) f->load(resume->folder);
    io::NamedTensors task_state = CheckpointStore::load_task_state(resume->folder, runtime.world->rank());
    const nlohmann::json saved_ranks = resume->trainer_state.value("world_size", nlohmann::json(0));
    if (!task_state.empty() && saved_ranks != nlohmann::json(runtime.world->size())) {
      // Each rank's share of it (a rollout's rows) means nothing to another number of ranks.
      log::warnf("checkpoint ", resume->folder, " was written by ", saved_ranks.dump(), " ranks: the task's own state "
                 "(e.g. the rollout being trained on) is not restored");
      task_state.clear();
    }
    task.restore_task_state(task_state);
    start_step_ = resume->step();
    run_->resumed(*resume);
  }
}

Trainer::~Trainer() = default;

void Trainer::save_checkpoint(int64_t step, bool wait) {
  nlohmann::json state = nlohmann::json::object();
  std::vector<CheckpointPart> parts;
  for (const Trained& t : trained_) {
    t.state->save_scaler_state(state);
    for (CheckpointPart& part : t.state->checkpoint_parts()) parts.push_back(std::move(part));
  }
  for (const auto& f : frozen_) {
    for (CheckpointPart& part : f->checkpoint_parts()) parts.push_back(std::move(part));
  }
  run_->save(step, parts, state, task_.task_state());
  if (wait) run_->finish_checkpoint();
  last_saved_step_ = step;
}

void Trainer::drop_partial_step(const std::vector<bool>& active) {
  for (size_t i = 0; i < trained_.size(); ++i) {
    if (active[i]) trained_[i].state->drop_partial_step();
  }
}

std::vector<EvalMetric> RunTask::eval_metrics(const LossSum& sums) const {
  return {{"val_ppl", "perplexity", std::exp(sums.loss_sum / std::max(1.0, sums.count))}};
}

LossSum evaluate_task(RunTask& task, const dist::ProcessGroup& data) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<torch::nn::Module*, bool>> modes;  // each model and whether it was training
  for (const RunModel& model : task.models()) {
    modes.emplace_back(model.module, model.module->is_training());
    model.module->eval();
  }
  LossSum local = task.evaluate(data.rank(), data.size());
  for (auto& [module, training] : modes) module->train(training);
  std::vector<double> values = {local.loss_sum, local.count, local.correct};
  values.insert(values.end(), local.extra.begin(), local.extra.end());
  torch::Tensor sums = torch::tensor(values, torch::TensorOptions(torch::kFloat64)).to(data.device());
  dist::all_reduce(sums, data);
  sums = sums.cpu();
  const double* v = sums.data_ptr<double>();
  return {v[0], v[1], v[2], std::vector<double>(v + 3, v + values.size())};
}

void Trainer::with_moving_averages(const std::function<void()>& body) {
  for (Trained& t : trained_) t.state->swap_ema();
  body();
  for (Trained& t : trained_) t.state->swap_ema();
}

LossSum Trainer::evaluate() {
  LossSum sums;
  with_moving_averages([&] { sums = evaluate_task(task_, *runtime_.mesh->group("data")); });
  return sums;
}

TrainSummary Trainer::run() {
  const TrainSummary summary = run_steps();
  run_->finish_checkpoint();  // one still being written (train.async_save)
  return summary;
}

TrainSummary Trainer::run_steps() {
  TrainSummary summary;
  summary.steps_done = start_step_;
  if (start_step_ >= settings_.steps) {
    log::infof("nothing to do: the run already completed ", start_step_, " of ", settings_.steps, " steps");
    return summary;
  }
  const auto& data = *runtime_.mesh->group("data");
  const int64_t micro_batch = settings_.micro_batch_size;
  StepLoop loop(settings_, runtime_, *run_, start_step_,
                {task_.item_name(), static_cast<double>(settings_.batch_size * task_.items_per_row()),
                 task_.flops_per_item(), trained_.front().state->compute_dtype()});
  if (runtime_.is_main()) {
    log::infof("training ", settings_.steps - start_step_, " steps: batch ", settings_.batch_size, " = micro ",
               micro_batch, " x ", data.size(), " data ranks x ", accumulation_, " accumulation");
  }
  const int64_t steps_per_epoch = task_.steps_per_epoch();
  auto add_epoch = [&](nlohmann::json& metrics, int64_t steps_done) {
    if (steps_per_epoch > 0) metrics["epoch"] = static_cast<double>(steps_done) / static_cast<double>(steps_per_epoch);
  };
  auto report_eval = [&](int64_t step) {
    LossSum eval;
    with_moving_averages([&] {
      eval = evaluate_task(task_, data);
      task_.after_evaluation(step, settings_.out_dir, runtime_.is_main());
    });
    summary.val_loss = eval.loss_sum / std::max(1.0, eval.count);
    nlohmann::json metrics = {{"step", step}, {"val_loss", summary.val_loss}};
    add_epoch(metrics, step);
    std::string line = "eval at step " + std::to_string(step) + ": loss " + fixed(summary.val_loss, 4);
    for (const EvalMetric& metric : task_.eval_metrics(eval)) {
      metrics[metric.key] = metric.value;
      line += ", " + metric.label + " " + (metric.percent ? fixed(100 * metric.value, 2) + "%" : fixed(metric.value, 2));
      if (metric.key == "val_accuracy") summary.val_accuracy = metric.value;
    }
    loop.print(line);
    run_->write_metrics(metrics);
  };

  for (const RunModel& model : models_) model.module->train(model.trained);
  const size_t n = trained_.size();
  // One model keeps the single-model figure names ("loss", "lr", ...); several prefix theirs with the name.
  auto key = [&](size_t i, const std::string& figure) {
    return trained_[i].name.empty() ? figure : trained_[i].name + "." + figure;
  };
  for (int64_t step = start_step_; step < settings_.steps; ++step) {
    loop.begin();
    std::vector<double> lrs, loss_scales, loss_sums(n, 0.0);
    std::vector<bool> active;
    for (const Trained& t : trained_) active.push_back(!task_.sits_out(t.name, step));
    for (Trained& t : trained_) {
      lrs.push_back(t.state->start_step(step));
      // The loss is scaled up so that small fp16 gradients survive; the gradients are scaled back below.
      loss_scales.push_back(t.state->loss_scale());
    }
    auto first_row = [&](int64_t micro) { return micro * micro_batch * data.size() + data.rank() * micro_batch; };
    if (task_.pipelined()) {
      // The schedule interleaves the micro-batches' backwards: the data-parallel average comes after.
      ModelState& state = *trained_.front().state;
      state.begin_pipelined_backward();
      std::vector<int64_t> first_rows;
      for (int64_t micro = 0; micro < accumulation_; ++micro) first_rows.push_back(first_row(micro));
      loss_sums[0] = task_.pipeline_step(step, first_rows, micro_batch, loss_scales[0]) * static_cast<double>(accumulation_);
      state.end_pipelined_backward();
    } else {
      bool interrupted = false;
      for (int64_t micro = 0; micro < accumulation_; ++micro) {
        // Ranks see a signal at different moments: they agree, and leave at the same micro-step.
        if (micro > 0 && on_any_rank(stop_requested(), *runtime_.world->world_group())) {
          interrupted = true;
          break;
        }
        const int passes = task_.backward_passes();
        for (int pass = 0; pass < passes; ++pass) {
          // Every model begins every pass (one without a loss in it just waits), and syncs in the last one.
          const bool sync = micro + 1 == accumulation_ && pass + 1 == passes;
          for (size_t i = 0; i < n; ++i) {
            if (active[i]) trained_[i].state->begin_backward(sync);
          }
          const std::map<std::string, torch::Tensor> losses =
              pass == 0 ? task_.losses(step, first_row(micro), micro_batch)
                        : task_.further_losses(pass, step, first_row(micro), micro_batch);
          // One backward of the models' scaled losses together: each model's gradients come from its own.
          torch::Tensor total;
          for (size_t i = 0; i < n; ++i) {
            if (!active[i]) continue;
            const auto found = losses.find(trained_[i].name);
            if (pass > 0 && found == losses.end()) continue;  // not in this pass
            KUAFU_CHECK(found != losses.end() && found->second.defined(), "the task gave no loss for model \"",
                        trained_[i].name, "\"");
            const torch::Tensor scaled = found->second * (loss_scales[i] / static_cast<double>(accumulation_));
            total = total.defined() ? total + scaled : scaled;
            loss_sums[i] += found->second.item<double>();
          }
          if (total.defined() && total.requires_grad()) total.backward();
        }
      }
      if (interrupted) {
        // A stop between micro-steps drops the partial step: its gradients are settled as a step's would
        // be (the same collectives on every rank) and then zeroed; the weights are those of `step` steps.
        drop_partial_step(active);
        loop.finish_progress();
        // (A stop during the save that just wrote this step finds it saved already.)
        if (step > start_step_ && step != last_saved_step_) save_checkpoint(step, /*wait=*/false);
        summary.stopped_by_signal = true;
        log::infof("stopped by signal during step ", step + 1, " (its micro-steps dropped); the weights are those of step ",
                   step);
        return summary;
      }
      for (size_t i = 0; i < n; ++i) {
        if (active[i]) trained_[i].state->end_backward();
      }
    }
    std::vector<double> grad_norms, mean_losses;
    bool non_finite = false;
    for (size_t i = 0; i < n; ++i) {
      grad_norms.push_back(active[i] ? trained_[i].state->grad_norm() : 0.0);
      non_finite = non_finite || !std::isfinite(grad_norms.back());
      mean_losses.push_back(loss_sums[i] / static_cast<double>(accumulation_));
    }
    const StepOutcome outcome = loop.agree(mean_losses, non_finite, run_->checkpoint_writing());
    // A checkpoint written in the background is sealed at the first step every rank has written its part.
    if (run_->checkpoint_pending() && !outcome.writing) run_->finish_checkpoint();
    double loss = 0;  // the models' losses together
    for (double model_loss : outcome.losses) loss += model_loss;
    const bool overflow = !std::isfinite(loss) || outcome.non_finite;
    bool scaled = true;  // every model has a loss scaler, which skips an overflowed step
    for (const Trained& t : trained_) scaled = scaled && t.state->loss_scaler();
    if (overflow && !scaled) {
      const auto last = run_->latest_checkpoint();
      std::string norms;
      for (size_t i = 0; i < n; ++i) norms += (i ? ", " : "") + detail::concat(grad_norms[i]);
      throw Error(detail::concat("training diverged at step ", step + 1, ": loss ", loss, ", gradient norm ",
                                 norms, ". Nothing was saved from this step; the last good checkpoint is ",
                                 last ? *last : std::string("none"),
                                 ". Lower optim.lr or raise optim.warmup_steps, then resume."));
    }
    for (size_t i = 0; i < n; ++i) {
      if (active[i]) trained_[i].state->finish_step(grad_norms[i], trained_[i].state->grad_clip(), overflow);
    }
    if (overflow) {
      summary.skipped_steps += 1;
      loop.print("step " + std::to_string(step + 1) + ": gradients overflowed at loss scale " + fixed(loss_scales[0], 0) +
                 "; step skipped");
    }
    summary.last_loss = loss;
    summary.steps_done = step + 1;

    nlohmann::json metrics = {{"loss", loss}};
    std::string fields = "loss " + fixed(loss, 4);
    for (size_t i = 0; i < n; ++i) {
      const ModelState& state = *trained_[i].state;
      if (n > 1) {
        metrics[key(i, "loss")] = outcome.losses[i];
        fields += " | " + trained_[i].name + " " + fixed(outcome.losses[i], 4);
      }
      metrics[key(i, "lr")] = lrs[i];
      metrics[key(i, "grad_norm")] = grad_norms[i];
      for (const auto& [name, value] : state.memory_figures()) metrics[key(i, name)] = value;
      if (state.loss_scaler()) {
        metrics[key(i, "loss_scale")] = loss_scales[i];
        metrics[key(i, "skipped")] = overflow;
      }
    }
    add_epoch(metrics, step + 1);
    fields += " | lr " + scientific(lrs[0], 3);
    for (const auto& [name, value] : task_.step_figures(step)) {
      metrics[name] = value;
      fields += " | " + name + " " + fixed(value, 3);
    }
    loop.end(step, metrics, fields);

    if (loop.evaluation_due(step)) report_eval(step + 1);
    if (loop.checkpoint_due(step, outcome.stop)) {
      loop.finish_progress();
      save_checkpoint(step + 1, /*wait=*/false);
    }
    if (outcome.stop && !loop.last(step)) {
      summary.stopped_by_signal = true;
      loop.print("stopped by signal after step " + std::to_string(step + 1));
      return summary;
    }
  }
  loop.finish_progress();
  report_eval(settings_.steps);
  return summary;
}

}  // namespace kuafu::train

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

double TrainTask::pipeline_step(int64_t, const std::vector<int64_t>&, int64_t, double) {
  fail("this task does not run a pipeline schedule");
}

bool TrainTask::set_block_hooks(hooks::BlockHooks* /*hooks*/) { return false; }

Trainer::Trainer(const config::Config& config, Runtime& runtime, TrainTask& task)
    : config_(config), runtime_(runtime), task_(task), settings_(read_train_settings(config)) {
  run_ = std::make_unique<RunFolder>(config, runtime, settings_, task.checkpoint_keys());
  accumulation_ = accumulation_steps(config, runtime);
  ModelStateOptions options;
  options.steps = settings_.steps;
  options.counts_in_global_norm = [&task](const std::string& name) { return task.counts_in_global_norm(name); };
  options.set_block_hooks = [&task](hooks::BlockHooks* hooks) { return task.set_block_hooks(hooks); };
  state_ = std::make_unique<ModelState>(config, runtime, task.model(), std::move(options));
  if (const std::optional<Resume> resume = run_->checkpoint_to_resume()) {
    state_->load(resume->folder, resume->trainer_state);
    start_step_ = resume->step();
    run_->resumed(*resume);
  }
}

Trainer::~Trainer() = default;

void Trainer::save_checkpoint(int64_t step) {
  nlohmann::json state;
  state_->save_scaler_state(state);
  run_->save(step, state_->checkpoint_parts(), state);
}

std::vector<EvalMetric> TrainTask::eval_metrics(const LossSum& sums) const {
  return {{"val_ppl", "perplexity", std::exp(sums.loss_sum / std::max(1.0, sums.count))}};
}

LossSum evaluate_task(TrainTask& task, const dist::ProcessGroup& data) {
  torch::NoGradGuard no_grad;
  const bool was_training = task.model().is_training();
  task.model().eval();
  LossSum local = task.evaluate(data.rank(), data.size());
  task.model().train(was_training);
  std::vector<double> values = {local.loss_sum, local.count, local.correct};
  values.insert(values.end(), local.extra.begin(), local.extra.end());
  torch::Tensor sums = torch::tensor(values, torch::TensorOptions(torch::kFloat64)).to(data.device());
  dist::all_reduce(sums, data);
  sums = sums.cpu();
  const double* v = sums.data_ptr<double>();
  return {v[0], v[1], v[2], std::vector<double>(v + 3, v + values.size())};
}

LossSum Trainer::evaluate() { return evaluate_task(task_, *runtime_.mesh->group("data")); }

TrainSummary Trainer::run() {
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
                 task_.flops_per_item(), state_->compute_dtype()});
  if (runtime_.is_main()) {
    log::infof("training ", settings_.steps - start_step_, " steps: batch ", settings_.batch_size, " = micro ",
               micro_batch, " x ", data.size(), " data ranks x ", accumulation_, " accumulation");
  }
  const int64_t steps_per_epoch = task_.steps_per_epoch();
  auto add_epoch = [&](nlohmann::json& metrics, int64_t steps_done) {
    if (steps_per_epoch > 0) metrics["epoch"] = static_cast<double>(steps_done) / static_cast<double>(steps_per_epoch);
  };
  auto report_eval = [&](int64_t step) {
    const LossSum eval = evaluate();
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

  task_.model().train();
  for (int64_t step = start_step_; step < settings_.steps; ++step) {
    loop.begin();
    const double lr = state_->start_step(step);
    // The loss is scaled up so that small fp16 gradients survive; the gradients are scaled back below.
    const double loss_scale = state_->loss_scale();

    double loss_sum = 0.0;
    auto first_row = [&](int64_t micro) { return micro * micro_batch * data.size() + data.rank() * micro_batch; };
    if (task_.pipelined()) {
      // The schedule interleaves the micro-batches' backwards: the data-parallel average comes after.
      state_->begin_pipelined_backward();
      std::vector<int64_t> first_rows;
      for (int64_t micro = 0; micro < accumulation_; ++micro) first_rows.push_back(first_row(micro));
      loss_sum = task_.pipeline_step(step, first_rows, micro_batch, loss_scale) * static_cast<double>(accumulation_);
      state_->end_pipelined_backward();
    } else {
      bool interrupted = false;
      for (int64_t micro = 0; micro < accumulation_; ++micro) {
        // Ranks see a signal at different moments: they agree, and leave at the same micro-step.
        if (micro > 0 && on_any_rank(stop_requested(), *runtime_.world->world_group())) {
          interrupted = true;
          break;
        }
        const bool sync = micro + 1 == accumulation_;
        state_->begin_backward(sync);
        torch::Tensor loss = task_.loss(step, first_row(micro), micro_batch);
        (loss * (loss_scale / static_cast<double>(accumulation_))).backward();
        loss_sum += loss.item<double>();
      }
      if (interrupted) {
        // A stop between micro-steps drops the partial step: its gradients are settled as a step's would
        // be (the same collectives on every rank) and then zeroed; the weights are those of `step` steps.
        state_->drop_partial_step();
        loop.finish_progress();
        if (step > start_step_) save_checkpoint(step);
        summary.stopped_by_signal = true;
        log::infof("stopped by signal during step ", step + 1, " (its micro-steps dropped); the weights are those of step ",
                   step);
        return summary;
      }
      state_->end_backward();
    }
    const double grad_norm = state_->grad_norm();
    const StepOutcome outcome = loop.agree(loss_sum / static_cast<double>(accumulation_), !std::isfinite(grad_norm));
    const double loss = outcome.loss;
    const bool overflow = !std::isfinite(loss) || outcome.non_finite;
    if (overflow && !state_->loss_scaler()) {
      const auto last = run_->latest_checkpoint();
      throw Error(detail::concat("training diverged at step ", step + 1, ": loss ", loss, ", gradient norm ",
                                 grad_norm, ". Nothing was saved from this step; the last good checkpoint is ",
                                 last ? *last : std::string("none"),
                                 ". Lower optim.lr or raise optim.warmup_steps, then resume."));
    }
    state_->finish_step(grad_norm, settings_.grad_clip, overflow);
    if (overflow) {
      summary.skipped_steps += 1;
      loop.print("step " + std::to_string(step + 1) + ": gradients overflowed at loss scale " + fixed(loss_scale, 0) +
                 "; step skipped");
    }
    summary.last_loss = loss;
    summary.steps_done = step + 1;

    nlohmann::json metrics = {{"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm}};
    add_epoch(metrics, step + 1);
    for (const auto& [name, value] : state_->memory_figures()) metrics[name] = value;
    if (state_->loss_scaler()) {
      metrics["loss_scale"] = loss_scale;
      metrics["skipped"] = overflow;
    }
    loop.end(step, metrics, "loss " + fixed(loss, 4) + " | lr " + scientific(lr, 3));

    if (loop.evaluation_due(step)) report_eval(step + 1);
    if (loop.checkpoint_due(step, outcome.stop)) {
      loop.finish_progress();
      save_checkpoint(step + 1);
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

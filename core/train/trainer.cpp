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
#include "core/train/progress.h"
#include "core/util/device.h"
#include "core/util/logging.h"

namespace kuafu::train {

void add_trainer_schema(config::Schema& s) {
  s.add_int("train.steps", 1000, "optimizer steps to train for (total, including resumed ones)").min(1);
  s.add_int("train.batch_size", 32, "global batch: rows per optimizer step over all ranks").min(1).max(1 << 24);
  s.add_int("train.micro_batch_size", 8, "rows per rank per micro-step; the rest is gradient accumulation")
      .min(1)
      .max(1 << 24);
  s.add_int("train.seed", 1337, "seed for initialisation and data order").min(0);
  s.add_int("train.log_interval", 10, "steps between plain progress lines").min(1);
  s.add_int("train.eval_interval", 0, "steps between evaluations; 0 = only at the end").min(0);
  s.add_int("train.eval_rows", 64, "evaluation windows (spread evenly over the validation data)").min(1);
  s.add_int("train.checkpoint_interval", 0, "steps between checkpoints; 0 = only at the end and on a stop signal")
      .min(0);
  s.add_int("train.keep_checkpoints", 3, "newest checkpoints to keep").min(1);
  s.add_string("train.out_dir", "runs/default", "folder for checkpoints, metrics.jsonl and logs");
  s.add_string("train.resume", "auto",
               "auto: continue from the latest checkpoint in out_dir if there is one; never: refuse to start "
               "where checkpoints exist; or the path of a checkpoint folder");
  s.add_string("train.progress", "auto", "progress display: auto (bar on a terminal), bar, plain")
      .choices({"auto", "bar", "plain"});
  optim::add_optimizer_schema(s);
  optim::add_precision_schema(s);
  memory::add_memory_schema(s);
}

namespace {

// Bytes each group has sent from this rank so far, by group name.
std::map<std::string, int64_t> bytes_sent_by_group(const dist::World& world) {
  std::map<std::string, int64_t> sent;
  for (const auto& group : world.groups()) sent[group->name()] = group->counters().bytes_sent;
  return sent;
}

// {"group": bytes} sent since `before`, leaving out groups that sent nothing.
nlohmann::json bytes_sent_since(const dist::World& world, const std::map<std::string, int64_t>& before) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, sent] : bytes_sent_by_group(world)) {
    const auto old = before.find(name);
    const int64_t delta = sent - (old == before.end() ? 0 : old->second);
    if (delta > 0) out[name] = delta;
  }
  return out;
}

std::string fixed(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

std::string scientific(double v, int digits) {
  std::ostringstream out;
  out << std::scientific << std::setprecision(digits) << v;
  return out.str();
}

}  // namespace

double TrainTask::pipeline_step(int64_t, const std::vector<int64_t>&, int64_t, double) {
  fail("this task does not run a pipeline schedule");
}

bool TrainTask::set_block_hooks(hooks::BlockHooks* /*hooks*/) { return false; }

Trainer::Trainer(const config::Config& config, Runtime& runtime, TrainTask& task)
    : config_(config), runtime_(runtime), task_(task) {
  steps_ = config.get_int("train.steps");
  global_batch_ = config.get_int("train.batch_size");
  micro_batch_ = config.get_int("train.micro_batch_size");
  run_ = std::make_unique<RunFolder>(config, runtime, task.checkpoint_keys());
  accumulation_ = accumulation_steps(config, runtime);
  ModelStateOptions options;
  options.steps = steps_;
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
  if (start_step_ >= steps_) {
    log::infof("nothing to do: the run already completed ", start_step_, " of ", steps_, " steps");
    return summary;
  }
  install_stop_signals();
  const auto& data = *runtime_.mesh->group("data");
  const auto& world = *runtime_.world->world_group();
  double peak_flops = measure_matmul_flops(runtime_.device, state_->compute_dtype()) * runtime_.world->size();
  const double items_per_step = static_cast<double>(global_batch_ * task_.items_per_row());
  const int64_t eval_interval = config_.get_int("train.eval_interval");
  const int64_t checkpoint_interval = config_.get_int("train.checkpoint_interval");
  const double max_norm = config_.get_float("optim.grad_clip");
  std::optional<Progress> progress;
  if (runtime_.is_main()) {
    progress.emplace(start_step_, steps_, config_.get_int("train.log_interval"), config_.get_string("train.progress"));
    log::infof("training ", steps_ - start_step_, " steps: batch ", global_batch_, " = micro ", micro_batch_, " x ",
               data.size(), " data ranks x ", accumulation_, " accumulation");
  }
  auto report_eval = [&](int64_t step) {
    const LossSum eval = evaluate();
    summary.val_loss = eval.loss_sum / std::max(1.0, eval.count);
    nlohmann::json metrics = {{"step", step}, {"val_loss", summary.val_loss}};
    std::string line = "eval at step " + std::to_string(step) + ": loss " + fixed(summary.val_loss, 4);
    for (const EvalMetric& metric : task_.eval_metrics(eval)) {
      metrics[metric.key] = metric.value;
      line += ", " + metric.label + " " + (metric.percent ? fixed(100 * metric.value, 2) + "%" : fixed(metric.value, 2));
      if (metric.key == "val_accuracy") summary.val_accuracy = metric.value;
    }
    if (progress) progress->print_line(line);
    run_->write_metrics(metrics);
  };

  task_.model().train();
  for (int64_t step = start_step_; step < steps_; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const double lr = state_->start_step(step);
    const auto sent_before = bytes_sent_by_group(*runtime_.world);
    // The loss is scaled up so that small fp16 gradients survive; the gradients are scaled back below.
    const double loss_scale = state_->loss_scale();

    double loss_sum = 0.0;
    auto first_row = [&](int64_t micro) { return micro * micro_batch_ * data.size() + data.rank() * micro_batch_; };
    if (task_.pipelined()) {
      // The schedule interleaves the micro-batches' backwards: the data-parallel average comes after.
      state_->begin_pipelined_backward();
      std::vector<int64_t> first_rows;
      for (int64_t micro = 0; micro < accumulation_; ++micro) first_rows.push_back(first_row(micro));
      loss_sum = task_.pipeline_step(step, first_rows, micro_batch_, loss_scale) * static_cast<double>(accumulation_);
      state_->end_pipelined_backward();
    } else {
      bool interrupted = false;
      for (int64_t micro = 0; micro < accumulation_; ++micro) {
        // Ranks see a signal at different moments: they agree, and leave at the same micro-step.
        if (micro > 0 && on_any_rank(stop_requested(), world)) {
          interrupted = true;
          break;
        }
        const bool sync = micro + 1 == accumulation_;
        state_->begin_backward(sync);
        torch::Tensor loss = task_.loss(step, first_row(micro), micro_batch_);
        (loss * (loss_scale / static_cast<double>(accumulation_))).backward();
        loss_sum += loss.item<double>();
      }
      if (interrupted) {
        // A stop between micro-steps drops the partial step: its gradients are settled as a step's would
        // be (the same collectives on every rank) and then zeroed; the weights are those of `step` steps.
        state_->drop_partial_step();
        if (progress) progress->finish();
        if (step > start_step_) save_checkpoint(step);
        summary.stopped_by_signal = true;
        log::infof("stopped by signal during step ", step + 1, " (its micro-steps dropped); the weights are those of step ",
                   step);
        return summary;
      }
      state_->end_backward();
    }
    const double grad_norm = state_->grad_norm();

    // One small all-reduce carries the loss and every rank's stop and non-finite flags.
    torch::Tensor flags = torch::tensor(
        {loss_sum / accumulation_, stop_requested() ? 1.0 : 0.0, std::isfinite(grad_norm) ? 0.0 : 1.0},
        torch::TensorOptions(torch::kFloat64).device(world.device()));
    dist::all_reduce(flags, world);
    const double loss = flags[0].item<double>() / world.size();
    const bool overflow = !std::isfinite(loss) || flags[2].item<double>() > 0;
    if (overflow && !state_->loss_scaler()) {
      const auto last = run_->latest_checkpoint();
      throw Error(detail::concat("training diverged at step ", step + 1, ": loss ", loss, ", gradient norm ",
                                 grad_norm, ". Nothing was saved from this step; the last good checkpoint is ",
                                 last ? *last : std::string("none"),
                                 ". Lower optim.lr or raise optim.warmup_steps, then resume."));
    }
    state_->finish_step(grad_norm, max_norm, overflow);
    if (overflow) {
      summary.skipped_steps += 1;
      if (progress) {
        progress->print_line("step " + std::to_string(step + 1) + ": gradients overflowed at loss scale " +
                             fixed(loss_scale, 0) + "; step skipped");
      }
    }
    synchronize(runtime_.device);  // the step's queued GPU work belongs to its time
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    summary.last_loss = loss;
    summary.steps_done = step + 1;

    const double items_per_s = items_per_step / seconds;
    const double achieved_flops = task_.flops_per_item() * items_per_s;
    if (achieved_flops > peak_flops) {
      // The probe ran while the machine was busier than now (seen: "MFU 219%" for a run started beside
      // a test suite): measure again, and never report more than the rate the step itself reached.
      peak_flops = std::max(achieved_flops, measure_matmul_flops(runtime_.device, state_->compute_dtype(), /*fresh=*/true) *
                                                runtime_.world->size());
    }
    const double mfu = achieved_flops / peak_flops;
    const double mem_mb = static_cast<double>(memory::peak_bytes(runtime_.device)) / (1 << 20);
    // Communication accounting: bytes this rank sent in the step, per process group.
    const nlohmann::json sent = runtime_.world->size() > 1 ? bytes_sent_since(*runtime_.world, sent_before)
                                                           : nlohmann::json::object();
    if (progress) {
      double sent_mb = 0;
      for (const auto& item : sent.items()) sent_mb += item.value().get<double>() / 1e6;
      progress->update(step, "loss " + fixed(loss, 4) + " | lr " + scientific(lr, 3) + " | " + fixed(items_per_s, 0) +
                                 " " + task_.item_name() + "/s | MFU " + fixed(mfu * 100, 1) + "% | mem " +
                                 fixed(mem_mb, 0) + " MB" + (sent.empty() ? "" : " | sent " + fixed(sent_mb, 1) + " MB"));
    }
    nlohmann::json metrics = {{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm},
                              {"step_time_s", seconds}, {task_.item_name() + "_per_s", items_per_s}, {"mfu", mfu},
                              {"peak_mem_mb", mem_mb}};
    if (runtime_.world->size() > 1) metrics["comm_bytes_sent"] = sent;
    for (const auto& [name, value] : state_->memory_figures()) metrics[name] = value;
    if (state_->loss_scaler()) {
      metrics["loss_scale"] = loss_scale;
      metrics["skipped"] = overflow;
    }
    run_->write_metrics(metrics);

    const bool last_step = step + 1 == steps_;
    const bool stop = flags[1].item<double>() > 0;
    if (eval_interval > 0 && (step + 1) % eval_interval == 0 && !last_step) report_eval(step + 1);
    if (last_step || stop || (checkpoint_interval > 0 && (step + 1) % checkpoint_interval == 0)) {
      if (progress) progress->finish();
      save_checkpoint(step + 1);
    }
    if (stop && !last_step) {
      summary.stopped_by_signal = true;
      if (progress) progress->print_line("stopped by signal after step " + std::to_string(step + 1));
      return summary;
    }
  }
  if (progress) progress->finish();
  report_eval(steps_);
  return summary;
}

}  // namespace kuafu::train

#include "core/train/step_loop.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "core/dist/collectives.h"
#include "core/memory/memory_meter.h"
#include "core/util/device.h"

namespace kuafu::train {

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

}  // namespace

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

std::string scientific(double value, int digits) {
  std::ostringstream out;
  out << std::scientific << std::setprecision(digits) << value;
  return out.str();
}

StepLoop::StepLoop(const TrainSettings& settings, const Runtime& runtime, const RunFolder& run, int64_t start_step,
                   StepWork work)
    : settings_(settings), runtime_(runtime), run_(run), work_(std::move(work)) {
  install_stop_signals();
  if (work_.flops_per_item > 0) peak_flops_ = measure_matmul_flops(runtime.device, work_.dtype) * runtime.world->size();
  if (runtime.is_main()) progress_.emplace(start_step, settings.steps, settings.log_interval, settings.progress);
}

void StepLoop::begin() {
  start_ = std::chrono::steady_clock::now();
  sent_before_ = bytes_sent_by_group(*runtime_.world);
}

StepOutcome StepLoop::agree(const std::vector<double>& losses, bool non_finite, bool writing) const {
  const auto& world = *runtime_.world->world_group();
  std::vector<double> values = {non_finite ? 1.0 : 0.0, stop_requested() ? 1.0 : 0.0, writing ? 1.0 : 0.0};
  values.insert(values.end(), losses.begin(), losses.end());
  torch::Tensor flags = torch::tensor(values, torch::TensorOptions(torch::kFloat64)).to(world.device());
  dist::all_reduce(flags, world);
  flags = flags.cpu();
  const double* v = flags.data_ptr<double>();
  StepOutcome outcome;
  outcome.non_finite = v[0] > 0;
  outcome.stop = v[1] > 0;
  outcome.writing = v[2] > 0;
  for (size_t i = 0; i < losses.size(); ++i) outcome.losses.push_back(v[3 + i] / world.size());
  return outcome;
}

void StepLoop::end(int64_t step, nlohmann::json metrics, const std::string& fields) {
  synchronize(runtime_.device);  // the step's queued GPU work belongs to its time
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double items_per_s = work_.items_per_step / seconds;
  const double achieved_flops = work_.flops_per_item * items_per_s;
  if (achieved_flops > peak_flops_) {
    // The probe ran while the machine was busier than now (seen: "MFU 219%" for a run started beside
    // a test suite): measure again, and never report more than the rate the step itself reached.
    peak_flops_ = std::max(achieved_flops,
                           measure_matmul_flops(runtime_.device, work_.dtype, /*fresh=*/true) * runtime_.world->size());
  }
  const double mfu = peak_flops_ > 0 ? achieved_flops / peak_flops_ : 0.0;
  const double mem_mb = static_cast<double>(memory::peak_bytes(runtime_.device)) / (1 << 20);
  // Communication accounting: bytes this rank sent in the step, per process group.
  const nlohmann::json sent =
      runtime_.world->size() > 1 ? bytes_sent_since(*runtime_.world, sent_before_) : nlohmann::json::object();
  if (progress_) {
    double sent_mb = 0;
    for (const auto& item : sent.items()) sent_mb += item.value().get<double>() / 1e6;
    progress_->update(step, fields + " | " + fixed(items_per_s, 0) + " " + work_.item_name + "/s | MFU " +
                                fixed(mfu * 100, 1) + "% | mem " + fixed(mem_mb, 0) + " MB" +
                                (sent.empty() ? "" : " | sent " + fixed(sent_mb, 1) + " MB"));
  }
  metrics["step"] = step + 1;
  metrics["step_time_s"] = seconds;
  metrics[work_.item_name + "_per_s"] = items_per_s;
  metrics["mfu"] = mfu;
  metrics["peak_mem_mb"] = mem_mb;
  if (runtime_.world->size() > 1) metrics["comm_bytes_sent"] = sent;
  run_.write_metrics(metrics);
}

bool StepLoop::evaluation_due(int64_t step) const {
  return settings_.eval_interval > 0 && (step + 1) % settings_.eval_interval == 0 && !last(step);
}

bool StepLoop::checkpoint_due(int64_t step, bool stopping) const {
  return last(step) || stopping || (settings_.checkpoint_interval > 0 && (step + 1) % settings_.checkpoint_interval == 0);
}

void StepLoop::print(const std::string& line) {
  if (progress_) progress_->print_line(line);
}

void StepLoop::finish_progress() {
  if (progress_) progress_->finish();
}

}  // namespace kuafu::train

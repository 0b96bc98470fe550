#include "core/train/step_profile.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "core/util/device.h"
#include "core/util/error.h"

namespace kuafu::train {

namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

constexpr size_t kTopEntries = 25;

// Name parts of each kind, first match wins (cuBLAS's nvjet/cutlass kernels, ATen's CPU operators).
const std::vector<std::pair<std::string, std::vector<std::string>>>& kinds() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> table = {
      {"matmul", {"gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm", "aten::bmm"}},
      {"attention", {"flash", "fmha", "attention", "sdpa"}},
      {"norm", {"layer_norm", "layernorm", "gammabeta", "rms_norm"}},
      {"loss", {"softmax", "nll", "cross_entropy", "logsumexp"}},
      {"optimizer", {"adam", "multi_tensor", "foreach"}},  // not "lamb": every "lambda" holds it
      {"gelu", {"gelu"}},
      {"copy", {"copy", "cast", "to_copy", "clone", "cat"}},
  };
  return table;
}

// A profiled entry's own time: a GPU kernel's duration, or a CPU operator's less its children's.
struct Entry {
  std::string name;
  double ns;
};

std::vector<Entry> gpu_kernels(const std::vector<profiler::KinetoEvent>& events) {
  std::vector<Entry> out;
  for (const profiler::KinetoEvent& e : events) {
    if (e.deviceType() == c10::DeviceType::CUDA) out.push_back({e.name(), static_cast<double>(e.durationNs())});
  }
  return out;
}

std::vector<Entry> cpu_self_times(const std::vector<profiler::KinetoEvent>& events) {
  // Per thread, by start: an operator's children are the later ones that end within it.
  std::map<uint64_t, std::vector<const profiler::KinetoEvent*>> by_thread;
  for (const profiler::KinetoEvent& e : events) {
    if (e.deviceType() == c10::DeviceType::CPU && e.durationNs() > 0) by_thread[e.startThreadId()].push_back(&e);
  }
  std::vector<Entry> out;
  for (auto& [thread, list] : by_thread) {
    std::sort(list.begin(), list.end(), [](const auto* a, const auto* b) {
      return a->startNs() != b->startNs() ? a->startNs() < b->startNs() : a->endNs() > b->endNs();
    });
    std::vector<size_t> open;  // indices into `out` of the operators that enclose the current one
    std::vector<uint64_t> open_end;
    for (const profiler::KinetoEvent* e : list) {
      while (!open_end.empty() && open_end.back() <= e->startNs()) {
        open.pop_back();
        open_end.pop_back();
      }
      if (!open.empty()) out[open.back()].ns -= static_cast<double>(e->durationNs());
      out.push_back({e->name(), static_cast<double>(e->durationNs())});
      open.push_back(out.size() - 1);
      open_end.push_back(e->endNs());
    }
  }
  return out;
}

}  // namespace

std::string kind_of_work(const std::string& name) {
  std::string lowered = name;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& [kind, parts] : kinds()) {
    for (const std::string& part : parts) {
      if (lowered.find(part) != std::string::npos) return kind;
    }
  }
  return "other";
}

nlohmann::json profile_steps(const std::function<void()>& step, int64_t steps, const torch::Device& device) {
  KUAFU_CHECK(steps > 0, "profile_steps needs at least one step");
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  for (int64_t i = 0; i < steps; ++i) step();
  synchronize(device);
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();

  std::vector<Entry> entries = gpu_kernels(result->events());
  const bool on_gpu = !entries.empty();
  if (!on_gpu) entries = cpu_self_times(result->events());
  std::map<std::string, double> by_name;
  for (const Entry& e : entries) by_name[e.name] += e.ns;
  const double per_step_ms = 1e-6 / static_cast<double>(steps);
  std::map<std::string, double> by_kind;
  std::vector<std::pair<double, std::string>> ranked;
  for (const auto& [name, ns] : by_name) {
    by_kind[kind_of_work(name)] += ns * per_step_ms;
    ranked.emplace_back(ns * per_step_ms, name);
  }
  std::sort(ranked.rbegin(), ranked.rend());
  nlohmann::json kinds_json = nlohmann::json::object(), top = nlohmann::json::array();
  for (const auto& [kind, ms] : by_kind) kinds_json[kind] = ms;
  for (size_t i = 0; i < std::min(kTopEntries, ranked.size()); ++i) top.push_back({ranked[i].second.substr(0, 100), ranked[i].first});
  return {{"source", on_gpu ? "cuda kernels" : "cpu operators"}, {"ms_per_step_by_kind", kinds_json}, {"top", top},
          {"steps", steps}};
}

double profiled_matmul_flops(const std::function<void()>& body) {
  const std::set<ActivityType> activities{ActivityType::CPU};
  // Input shapes are what the profiler works the FLOPs out from.
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO, /*report_input_shapes=*/true,
                                                     /*profile_memory=*/false, /*with_stack=*/false, /*with_flops=*/true);
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  body();
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  static const std::set<std::string> products = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"};
  double flops = 0;
  for (const profiler::KinetoEvent& e : result->events()) {
    if (products.count(e.name())) flops += static_cast<double>(e.flops());
  }
  return flops;
}

}  // namespace kuafu::train

#include "core/ops/attention_kernels.h"

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::ops {
namespace {

std::string chosen = "auto";
std::atomic<bool> recording{false};
std::mutex seen_mutex;
std::set<std::string> seen;

}  // namespace

const std::vector<std::string>& attention_backend_names() {
  static const std::vector<std::string> names = {"auto", "flash", "efficient", "cudnn", "math"};
  return names;
}

void choose_attention_backend(const std::string& name) {
  const auto& names = attention_backend_names();
  KUAFU_CHECK(std::find(names.begin(), names.end(), name) != names.end(), "unknown attention backend \"", name,
              "\" (one of ", text::join(names, ", "), ")");
  const bool all = name == "auto";
  at::Context& context = at::globalContext();
  context.setSDPUseFlash(all || name == "flash");
  context.setSDPUseMemEfficient(all || name == "efficient");
  context.setSDPUseCuDNN(all || name == "cudnn");
  context.setSDPUseMath(all || name == "math");
  chosen = name;
}

const std::string& chosen_attention_backend() { return chosen; }

std::string libtorch_attention_kernel(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& mask, double dropout, bool causal) {
  const std::optional<torch::Tensor> attn_mask = mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt;
  int64_t choice = static_cast<int64_t>(at::SDPBackend::error);
  try {
    choice = at::_fused_sdp_choice(q, k, v, attn_mask, dropout, causal);
  } catch (const c10::Error&) {  // the CPU's choice throws where the GPU's answers "error"
  }
  switch (static_cast<at::SDPBackend>(choice)) {
    case at::SDPBackend::flash_attention: return "flash";
    case at::SDPBackend::efficient_attention: return "efficient";
    case at::SDPBackend::cudnn_attention: return "cudnn";
    case at::SDPBackend::math: return "math";
    case at::SDPBackend::overrideable: return "overrideable";
    default: return "none";
  }
}

void record_attention_kernels(bool on) {
  std::lock_guard<std::mutex> lock(seen_mutex);
  if (on) seen.clear();
  recording.store(on);
}

bool recording_attention_kernels() { return recording.load(std::memory_order_relaxed); }

void note_attention_kernel(const std::string& name) {
  std::lock_guard<std::mutex> lock(seen_mutex);
  seen.insert(name);
}

std::vector<std::string> attention_kernels_seen() {
  std::lock_guard<std::mutex> lock(seen_mutex);
  return {seen.begin(), seen.end()};
}

}  // namespace kuafu::ops

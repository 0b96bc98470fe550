#include "core/memory/frozen_offload.h"

#include <set>

#include "core/util/error.h"

namespace kuafu::memory {

FrozenWeightOffload::FrozenWeightOffload(torch::nn::Module& model, const torch::Device& device) : device_(device) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.requires_grad() || !p.is_floating_point()) continue;
    // A weight made in host memory (lazy construction) stays where it is.
    torch::Tensor host = p.detach();
    if (!p.device().is_cpu() || (device.is_cuda() && !p.is_pinned())) {
      host = torch::empty(p.sizes(), p.options().device(torch::kCPU).pinned_memory(device.is_cuda()));
      host.copy_(p);
    }
    host_bytes_ += host.numel() * static_cast<int64_t>(host.element_size());
    p.set_data(host);
    frozen_[p.unsafeGetTensorImpl()] = {p, host};
  }
  KUAFU_CHECK(!frozen_.empty(), "offloading frozen weights: the model has none (turn LoRA on, lora.rank > 0)");
}

FrozenWeightOffload::~FrozenWeightOffload() {
  torch::NoGradGuard no_grad;
  for (auto& [impl, f] : frozen_) f.parameter.set_data(f.host.to(device_));
}

std::vector<FrozenWeightOffload::Frozen*> FrozenWeightOffload::frozen_of(const hooks::BlockCall& call) {
  std::vector<Frozen*> found;
  std::set<torch::TensorImpl*> seen;  // a tied weight can be in two of the call's modules
  for (const torch::nn::Module* module : call.modules) {
    for (const auto& p : module->parameters()) {
      const auto it = frozen_.find(p.unsafeGetTensorImpl());
      if (it != frozen_.end() && seen.insert(it->first).second) found.push_back(&it->second);
    }
  }
  return found;
}

void FrozenWeightOffload::fetch(const hooks::BlockCall& call) {
  torch::NoGradGuard no_grad;
  for (Frozen* f : frozen_of(call)) {
    // A fresh copy on the device each time (a real copy on a CPU run too); the host copy stays home.
    torch::Tensor here = torch::empty(f->host.sizes(), f->host.options().device(device_).pinned_memory(false));
    here.copy_(f->host, /*non_blocking=*/device_.is_cuda());
    f->parameter.set_data(here);
  }
}

void FrozenWeightOffload::release(const hooks::BlockCall& call) {
  torch::NoGradGuard no_grad;
  // The device copy is freed once nothing else holds it (a checkpointed forward keeps nothing).
  for (Frozen* f : frozen_of(call)) f->parameter.set_data(f->host);
}

std::string FrozenWeightOffload::describe() const {
  return "frozen weights offloaded: " + std::to_string(frozen_.size()) + " tensors, " + std::to_string(host_bytes_ >> 20) +
         " MiB in host memory, brought to " + device_.str() + " one block at a time";
}

}  // namespace kuafu::memory

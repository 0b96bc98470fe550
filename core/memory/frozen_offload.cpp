#include "core/memory/frozen_offload.h"

#include <set>
#include <utility>

#include "core/memory/storage_memory.h"
#include "core/util/error.h"

namespace kuafu::memory {

FrozenWeightOffload::FrozenWeightOffload(torch::nn::Module& model, const torch::Device& device, std::optional<DiskTierOptions> disk)
    : device_(device) {
  torch::NoGradGuard no_grad;
  if (disk) disk_ = std::make_unique<DiskTier>(std::move(*disk));
  for (const auto& item : model.named_parameters()) {
    torch::Tensor p = item.value();
    if (p.requires_grad() || !p.is_floating_point()) continue;
    named_[item.key()] = p.unsafeGetTensorImpl();
    if (disk_) {
      // Its file written from a host copy; while away the parameter is its shape without memory.
      const int64_t chunk = static_cast<int64_t>(frozen_.size());
      const torch::Tensor values = p.detach().to(torch::kCPU).contiguous();
      const int64_t bytes = values.numel() * static_cast<int64_t>(values.element_size());
      disk_->write(chunk, values.data_ptr(), bytes).wait();
      disk_bytes_ += bytes;
      const torch::Tensor away = torch::empty(p.sizes(), p.options().device(torch::kCPU));
      free_storage(away);
      p.set_data(away);
      frozen_[p.unsafeGetTensorImpl()] = {p, away, chunk};
      continue;
    }
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
  drop_read_ahead();
  for (auto& [impl, f] : frozen_) {
    DiskTransfer read;
    const torch::Tensor values = from_home(f, &read);
    read.wait();
    f.parameter.set_data(values.to(device_));
  }
}

torch::Tensor FrozenWeightOffload::from_home(Frozen& f, DiskTransfer* pending) {
  if (f.chunk < 0) return f.host;
  torch::Tensor buffer = torch::empty(f.host.sizes(), f.host.options().device(torch::kCPU).pinned_memory(device_.is_cuda()));
  *pending = disk_->read(f.chunk, buffer.data_ptr(), buffer.numel() * static_cast<int64_t>(buffer.element_size()));
  return buffer;
}

io::NamedTensors FrozenWeightOffload::with_values_from_disk(io::NamedTensors weights) {
  if (!disk_) return weights;
  std::vector<DiskTransfer> reads;
  for (auto& [name, tensor] : weights) {
    const auto it = named_.find(name);
    if (it == named_.end()) continue;
    reads.emplace_back();
    tensor = from_home(frozen_.at(it->second), &reads.back());
  }
  for (const DiskTransfer& read : reads) read.wait();
  return weights;
}

void FrozenWeightOffload::write_values_to_disk(const io::NamedTensors& weights) {
  if (!disk_) return;
  drop_read_ahead();  // it holds the values these replace
  std::vector<DiskTransfer> writes;
  for (const auto& [name, tensor] : weights) {
    const auto it = named_.find(name);
    if (it == named_.end()) continue;
    const Frozen& f = frozen_.at(it->second);
    KUAFU_CHECK(tensor.is_cpu() && tensor.is_contiguous() && tensor.scalar_type() == f.host.scalar_type() &&
                    tensor.sizes() == f.host.sizes(),
                "frozen weights on the disk tier: ", name, " must come back as the host copy with_values_from_disk gave");
    writes.push_back(disk_->write(f.chunk, tensor.data_ptr(), tensor.numel() * static_cast<int64_t>(tensor.element_size())));
  }
  for (const DiskTransfer& write : writes) write.wait();
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

FrozenWeightOffload::Reads FrozenWeightOffload::start_reads(const std::string& key, const std::vector<Frozen*>& frozen) {
  // All of a call's reads are queued before any is waited for (the I/O threads share them).
  Reads reads{key, frozen, {}, std::vector<DiskTransfer>(frozen.size())};
  for (size_t i = 0; i < frozen.size(); ++i) reads.homes.push_back(from_home(*frozen[i], &reads.transfers[i]));
  return reads;
}

void FrozenWeightOffload::read_ahead(const std::string& key, const std::vector<Frozen*>& frozen) {
  frozen_by_call_[key] = frozen;
  if (!last_call_.empty()) next_call_[last_call_] = key;
  last_call_ = key;
  const auto next = next_call_.find(key);
  if (next != next_call_.end()) ahead_ = start_reads(next->second, frozen_by_call_.at(next->second));
}

void FrozenWeightOffload::drop_read_ahead() {
  if (!ahead_) return;
  for (const DiskTransfer& t : ahead_->transfers) {
    try {
      t.wait();
    } catch (const Error&) {  // values never used: a read of the same file when they are needed reports it
    }
  }
  ahead_.reset();
}

void FrozenWeightOffload::fetch(const hooks::BlockCall& call, const std::string& kind) {
  torch::NoGradGuard no_grad;
  const std::string key = kind + call.name;
  const std::vector<Frozen*> frozen = frozen_of(call);
  std::optional<Reads> reads;
  if (ahead_ && ahead_->key == key && ahead_->frozen == frozen) {
    reads = std::exchange(ahead_, std::nullopt);
    ++calls_read_ahead_;
  } else {
    drop_read_ahead();  // another call came than last time
    reads = start_reads(key, frozen);
  }
  // Queued behind this call's own reads, read while its block computes.
  if (disk_ && disk_->options().read_ahead) read_ahead(key, frozen);
  const std::vector<torch::Tensor>& homes = reads->homes;
  for (size_t i = 0; i < frozen.size(); ++i) {
    reads->transfers[i].wait();
    Frozen& f = *frozen[i];
    if (f.chunk >= 0 && device_.is_cpu()) {  // what was read is already the block's own copy
      f.parameter.set_data(homes[i]);
      continue;
    }
    // A fresh copy on the device each time (a real copy on a CPU run too); the host copy stays home.
    torch::Tensor here = torch::empty(homes[i].sizes(), homes[i].options().device(device_).pinned_memory(false));
    here.copy_(homes[i], /*non_blocking=*/device_.is_cuda());
    f.parameter.set_data(here);
  }
}

void FrozenWeightOffload::release(const hooks::BlockCall& call) {
  torch::NoGradGuard no_grad;
  // The device copy is freed once nothing else holds it (a checkpointed forward keeps nothing).
  for (Frozen* f : frozen_of(call)) f->parameter.set_data(f->host);
}

std::string FrozenWeightOffload::describe() const {
  if (disk_) {
    return "frozen weights offloaded to the disk: " + std::to_string(frozen_.size()) + " tensors, " +
           std::to_string(disk_bytes_ >> 20) + " MiB in files under " + disk_->folder() +
           (disk_->direct() ? " (O_DIRECT)" : " (through the page cache)") + ", read to " + device_.str() +
           " one block at a time, the next block's read ahead";
  }
  return "frozen weights offloaded: " + std::to_string(frozen_.size()) + " tensors, " + std::to_string(host_bytes_ >> 20) +
         " MiB in host memory, brought to " + device_.str() + " one block at a time";
}

}  // namespace kuafu::memory

#include "core/optim/optimizer.h"

#include <ATen/ops/_foreach_norm.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/dist/collectives.h"
#include "core/optim/cpu_sum_of_squares.h"
#include "core/optim/grad_norm.h"
#include "core/util/error.h"

namespace kuafu::optim {
namespace {

// Optimizer state is kept in float32 for low-precision parameters and in the parameter's own dtype otherwise.
torch::Dtype state_dtype(const torch::Tensor& param) {
  return param.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  std::set<std::string> names;
  for (const auto& group : groups_) {
    for (const auto& p : group.params) {
      KUAFU_CHECK(names.insert(p.name).second, "parameter '", p.name, "' is in more than one optimizer group");
      KUAFU_CHECK(p.tensor.is_floating_point(), "parameter '", p.name, "' is not a floating-point tensor");
    }
  }
  states_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) states_[g].resize(groups_[g].params.size());
}

void Optimizer::step(double grad_factor) {
  begin_step();
  if (grad_factor != 1.0 && !takes_grad_factor()) {
    for (const ParamGroup& group : groups_) scale_grads(group.params, grad_factor);
    grad_factor = 1.0;
  }
  grad_factor_ = grad_factor;
  update(nullptr);
  grad_factor_ = 1.0;
}

void Optimizer::begin_step() {
  torch::NoGradGuard no_grad;
  ++steps_;
  before_update();
}

void Optimizer::update(const std::function<bool(const std::string& name)>& selected) {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<size_t> chosen;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      if (!selected || selected(groups_[g].params[i].name)) chosen.push_back(i);
    }
    if (chosen.empty()) continue;
    for (size_t i : chosen) ensure_state(g, i);
    if (chosen.size() == groups_[g].params.size()) {
      update_group(groups_[g], states_[g]);
      continue;
    }
    // A part of the group: its parameters and their state (the same tensors, updated in place).
    ParamGroup part{groups_[g].name, {}, groups_[g].options};
    std::vector<std::vector<torch::Tensor>> part_states;
    for (size_t i : chosen) {
      part.params.push_back(groups_[g].params[i]);
      part_states.push_back(states_[g][i]);
    }
    update_group(part, part_states);
  }
}

void Optimizer::ensure_state(size_t g, size_t i) {
  auto& state = states_[g][i];
  const auto& p = groups_[g].params[i].tensor;
  if (state.empty()) {
    for (size_t s = 0, n = slot_names().size(); s < n; ++s) {
      state.push_back(torch::zeros_like(p, p.options().dtype(state_dtype(p))));
    }
  }
  // The state lives where its parameter lives (Gemini may move a master chunk to another tier).
  for (auto& slot : state) {
    if (slot.device() != p.device()) slot = slot.to(p.device());
  }
}

void Optimizer::prepare_device_step() {
  KUAFU_CHECK(can_step_on_device(), name(), " has no step on the device (AdamW and Adam have)");
  torch::NoGradGuard no_grad;
  ++steps_;
  if (device_lrs_.empty()) {
    torch::Device device = torch::kCPU;
    for (const ParamGroup& group : groups_) {
      if (!group.params.empty()) device = group.params.front().tensor.device();
    }
    const auto scalar = torch::TensorOptions(torch::kFloat32).device(device);
    for (size_t g = 0; g < groups_.size(); ++g) device_lrs_.push_back(torch::zeros({}, scalar));
    device_step_ = torch::zeros({}, scalar);
  }
  // Filled in place (queued, not waited for): a captured graph reads these same tensors at every replay.
  // Each rate is rounded to float32 from the double, as the fused kernel rounds step()'s.
  for (size_t g = 0; g < groups_.size(); ++g) device_lrs_[g].fill_(lr_ * groups_[g].options.lr_scale);
  device_step_.fill_(static_cast<double>(steps_));
}

void Optimizer::step_on_device(const torch::Tensor& grad_factor, const torch::Tensor& skip) {
  KUAFU_CHECK(device_step_.defined(), "step_on_device() before prepare_device_step()");
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].params.empty()) continue;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) ensure_state(g, i);
    update_group_on_device(groups_[g], states_[g], {device_lrs_[g], device_step_, grad_factor, skip});
  }
}

void Optimizer::update_group_on_device(ParamGroup&, std::vector<std::vector<torch::Tensor>>&, const DeviceScalars&) {
  fail(detail::concat(name(), " has no step on the device (AdamW and Adam have)"));
}

void Optimizer::set_state(const std::string& name, std::vector<torch::Tensor> slots) {
  const auto names = slot_names();
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Param& p = groups_[g].params[i];
      if (p.name != name) continue;
      KUAFU_CHECK(slots.size() == names.size(), "optimizer state for '", name, "': ", slots.size(), " slots given, ",
                  this->name(), " keeps ", names.size());
      for (const auto& slot : slots) {
        KUAFU_CHECK(slot.sizes() == p.tensor.sizes() && slot.scalar_type() == state_dtype(p.tensor) &&
                        slot.device() == p.tensor.device(),
                    "optimizer state for '", name, "' must match the parameter's shape, device and state dtype");
      }
      states_[g][i] = std::move(slots);
      return;
    }
  }
  fail(detail::concat("no optimizer parameter named '", name, "' to place state for"));
}

void Optimizer::zero_grad() {
  for (auto& group : groups_) {
    for (auto& p : group.params) {
      if (p.tensor.grad().defined()) p.tensor.mutable_grad().zero_();
    }
  }
}

io::NamedTensors Optimizer::state_tensors() const {
  io::NamedTensors out;
  // A host counter: checkpoints write it from there.
  out.emplace_back("step", torch::tensor({steps_}, torch::TensorOptions(torch::kInt64).device(torch::kCPU)));
  const auto slots = slot_names();
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const auto& state = states_[g][i];
      for (size_t s = 0; s < state.size(); ++s) {
        out.emplace_back(groups_[g].params[i].name + "/" + slots[s], state[s]);  // see state_owner()
      }
    }
  }
  return out;
}

void Optimizer::load_state_tensors(const io::SafetensorsFile& saved, const std::string& where, bool part) {
  SavedState state;
  state.metadata = saved.metadata;
  state.count = saved.tensors.size();
  state.read = [&saved](const std::string& name) -> std::optional<torch::Tensor> {
    const torch::Tensor* found = saved.find(name);
    if (!found) return std::nullopt;
    return *found;
  };
  load_state_tensors(state, where, part);
}

void Optimizer::load_state_tensors(const SavedState& saved, const std::string& where, bool part) {
  const auto algorithm = saved.metadata.find("optimizer");
  KUAFU_CHECK(algorithm == saved.metadata.end() || algorithm->second == name(), where, ": optimizer state of ",
              algorithm == saved.metadata.end() ? "" : algorithm->second, " cannot resume ", name(),
              " (optim.name changed?)");
  const std::optional<torch::Tensor> step = saved.read("step");
  KUAFU_CHECK(step && step->numel() == 1, where, ": lacks the 'step' counter");
  const int64_t saved_steps = step->to(torch::kInt64).item<int64_t>();
  const auto slots = slot_names();
  size_t used = 1;
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Param& p = groups_[g].params[i];
      std::vector<torch::Tensor>& state = states_[g][i];
      for (size_t s = 0; s < slots.size(); ++s) {
        const std::string state_name = p.name + "/" + slots[s];
        const std::optional<torch::Tensor> value = saved.read(state_name);
        if (saved_steps == 0 && !value) continue;  // nothing was created before the first step
        KUAFU_CHECK(value, where, ": no '", slots[s], "' state for parameter '", p.name,
                    "' (checkpoint from another model or optimizer?)");
        KUAFU_CHECK(value->sizes() == p.tensor.sizes(), where, ": '", state_name, "' has shape ", value->sizes(),
                    " but the parameter has ", p.tensor.sizes());
        io::check_loadable(where, state_name, *value, state_dtype(p.tensor));
        ++used;
        if (state.size() != slots.size()) state.assign(slots.size(), torch::Tensor());
        if (state[s].defined()) {
          state[s].copy_(*value);  // in place: no second copy of the state is ever held
        } else {
          const torch::Tensor moved = value->to(p.tensor.device(), state_dtype(p.tensor));
          state[s] = moved.is_same(*value) ? moved.clone() : moved;  // never a view of what was read
        }
      }
      KUAFU_CHECK(std::all_of(state.begin(), state.end(), [](const torch::Tensor& t) { return t.defined(); }), where,
                  ": parameter '", p.name, "' has some of its state slots but not all");
    }
  }
  KUAFU_CHECK(part || used == saved.count, where, ": holds ", saved.count - used,
              " state tensors this optimizer does not use (different model or optimizer?)");
  steps_ = saved_steps;
}

std::optional<std::string> state_owner(const std::string& state_name) {
  const auto slash = state_name.rfind('/');
  if (slash == std::string::npos) return std::nullopt;
  return state_name.substr(0, slash);
}

torch::Tensor squared_norm(const torch::Tensor& t) {
  if (t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous()) {
    return torch::scalar_tensor(cpu_sum_of_squares(t.data_ptr<float>(), t.numel()), torch::kFloat64);
  }
  return at::linalg_vector_norm(t, 2, at::OptionalIntArrayRef(), /*keepdim=*/false, torch::kFloat64).square();
}

torch::Tensor squared_norms(const std::vector<torch::Tensor>& tensors, const std::vector<dist::GroupPtr>& groups) {
  KUAFU_CHECK(tensors.size() == groups.size(), "squared_norms: ", tensors.size(), " tensors but ", groups.size(),
              " groups");
  if (tensors.empty()) return torch::zeros({0}, torch::TensorOptions(torch::kFloat64).device(torch::kCPU));  // nothing to sum
  // Gathered where the groups communicate (else where the first tensor lives); each norm is taken on
  // its tensor's device (Gemini keeps some on the host) and no host synchronisation happens per parameter.
  torch::Device device = tensors.front().device();
  for (const auto& group : groups) {
    if (group) device = group->device();
  }
  torch::Tensor sums;
  const bool one_gpu = std::all_of(tensors.begin(), tensors.end(), [&](const torch::Tensor& t) {
    return t.is_cuda() && t.device() == tensors.front().device();
  });
  if (one_gpu) {
    // One multi-tensor launch instead of a few kernels per tensor (~200 for a 125M-parameter model).
    sums = torch::stack(at::_foreach_norm(tensors, 2, torch::kFloat64)).square().to(device);
  } else {
    std::vector<torch::Tensor> local;
    local.reserve(tensors.size());
    for (const auto& t : tensors) local.push_back(squared_norm(t).to(device));
    sums = torch::stack(local);
  }
  // One all-reduce per distinct group, in order of first appearance (the same on every rank).
  std::vector<const dist::ProcessGroup*> order;
  std::map<const dist::ProcessGroup*, std::vector<int64_t>> members;
  for (size_t i = 0; i < groups.size(); ++i) {
    const dist::ProcessGroup* group = groups[i].get();
    if (!group || group->size() == 1) continue;
    if (!members.count(group)) order.push_back(group);
    members[group].push_back(static_cast<int64_t>(i));
  }
  for (const auto* group : order) {
    torch::Tensor index = torch::tensor(members[group], torch::TensorOptions(torch::kInt64).device(sums.device()));
    torch::Tensor part = sums.index_select(0, index);
    dist::all_reduce(part, *group);
    sums.index_copy_(0, index, part);
  }
  return sums;
}

}  // namespace kuafu::optim

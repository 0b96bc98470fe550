#include "core/memory/zero.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <set>

#include "core/util/error.h"

namespace kuafu::memory {
namespace {

bool low_precision(torch::Dtype dtype) { return dtype == torch::kBFloat16 || dtype == torch::kHalf; }

}  // namespace

// Runs after the AccumulateGrad node of one parameter: its .grad now holds this backward's sum.
struct ZeroRedundancy::GradReadyHook : torch::autograd::FunctionPostHook {
  GradReadyHook(ZeroRedundancy* owner, int64_t tensor) : owner(owner), tensor(tensor) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    owner->on_grad_ready(tensor);
    return outputs;
  }
  ZeroRedundancy* owner;
  int64_t tensor;
};

ZeroRedundancy::ZeroRedundancy(torch::nn::Module& model, dist::GroupPtr group, const ZeroOptions& options)
    : model_(model), group_(std::move(group)), stage_(options.stage), rank_(group_->rank()), dtype_(options.dtype) {
  KUAFU_CHECK(stage_ == 1 || stage_ == 2, "ZeRO stage must be 1 or 2, got ", stage_);
  torch::NoGradGuard no_grad;
  const auto named = model.named_parameters();
  std::vector<std::string> registration_order;
  for (auto it = named.begin(); it != named.end(); ++it) {
    if (it->value().requires_grad()) registration_order.push_back(it->key());
  }
  // Reverse registration order approximates the order gradients become ready in backward.
  names_.assign(registration_order.rbegin(), registration_order.rend());
  std::vector<int64_t> numels;
  for (const auto& name : names_) {
    const torch::Tensor& p = named[name];
    KUAFU_CHECK(p.is_floating_point(), "ZeRO: parameter '", name, "' is not floating-point");
    KUAFU_CHECK(p.scalar_type() == named[names_.front()].scalar_type() && p.device() == named[names_.front()].device(),
                "ZeRO: parameter '", name, "' differs in dtype or device from '", names_.front(), "'");
    params_.push_back(p);
    numels.push_back(p.numel());
  }
  KUAFU_CHECK(!params_.empty(), "ZeRO: the model has no trainable parameters");
  const int p = group_->size();
  const int64_t chunk = options.chunk_numel > 0
                            ? options.chunk_numel
                            : search_chunk_numel(numels, 0, kMaxChunkBytes / torch::elementSize(dtype_), 1024, p);
  layout_.emplace(numels, chunk, p);

  // Rank 0's initial weights everywhere, as plain data parallelism does.
  for (auto param : model.parameters()) dist::broadcast(param, *group_, 0);
  for (auto buffer : model.buffers()) dist::broadcast(buffer, *group_, 0);

  const torch::Dtype master_dtype = low_precision(dtype_) ? torch::kFloat32 : params_.front().scalar_type();
  const auto options_of = [&](torch::Dtype dtype) { return params_.front().options().dtype(dtype).requires_grad(false); };
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    // Whole chunk in the parameters' own (float32) precision first, so the masters are never rounded.
    torch::Tensor whole = torch::zeros({layout_->chunk_numel(c)}, options_of(master_dtype));
    for (int64_t i : layout_->tensors_in(c)) {
      whole.narrow(0, layout_->slot(i).offset, params_[i].numel()).copy_(params_[i].reshape(-1));
    }
    const int64_t shard = layout_->shard_numel(c);
    if (low_precision(dtype_)) {
      master_shards_.push_back(whole.narrow(0, rank_ * shard, shard).clone());
      whole = whole.to(dtype_);
    } else {
      master_shards_.push_back(whole.narrow(0, rank_ * shard, shard));  // the chunk is the master
    }
    param_chunks_.push_back(whole);
    grad_shards_.push_back(torch::zeros({shard}, options_of(master_dtype)));
    grad_chunks_.push_back(stage_ == 1 ? torch::zeros({layout_->chunk_numel(c)}, options_of(dtype_)) : torch::Tensor());
  }
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    const TensorSlot& slot = layout_->slot(i);
    torch::Tensor& param = params_[i];
    param.set_data(param_chunks_[slot.chunk].narrow(0, slot.offset, slot.numel).view(param.sizes()));
    // Stage 1 accumulates in place into the whole gradient chunk; stage 2 copies out in the hook.
    param.mutable_grad() = stage_ == 1 ? grad_chunks_[slot.chunk].narrow(0, slot.offset, slot.numel).view(param.sizes())
                                       : torch::Tensor();
  }
  if (low_precision(dtype_)) {
    for (auto& buffer : model.buffers()) {
      if (buffer.is_floating_point()) buffer.set_data(buffer.data().to(dtype_));
    }
  }
  for (const auto& name : registration_order) {
    const int64_t i = index_of(name);
    const Piece piece = layout_->piece(i, rank_);
    const int64_t c = layout_->slot(i).chunk;
    optim::Param param{name, master_shards_[c].narrow(0, piece.shard_offset, piece.numel), group_, true};
    param.tensor.mutable_grad() = grad_shards_[c].narrow(0, piece.shard_offset, piece.numel);
    pieces_.push_back(std::move(param));
  }
  pending_.assign(layout_->num_chunks(), 0);
  in_flight_.resize(layout_->num_chunks());
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    accumulator->add_post_hook(std::make_unique<GradReadyHook>(this, i));
    accumulators_.push_back(std::move(accumulator));
  }
}

ZeroRedundancy::~ZeroRedundancy() = default;

int64_t ZeroRedundancy::index_of(const std::string& name) const {
  for (int64_t i = 0; i < static_cast<int64_t>(names_.size()); ++i) {
    if (names_[i] == name) return i;
  }
  fail("ZeRO: no trainable parameter named '" + name + "'");
}

void ZeroRedundancy::begin_backward(bool sync) {
  // Stage 2 keeps no whole gradients: every micro-step's gradients leave during its backward, and the
  // previous micro-step's reductions land in the shards before this one starts.
  if (in_backward_ && sync_) drain();
  sync_ = sync || stage_ == 2;
  in_backward_ = true;
  next_to_launch_ = 0;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    pending_[c] = static_cast<int64_t>(layout_->tensors_in(c).size());
  }
}

void ZeroRedundancy::on_grad_ready(int64_t i) {
  if (!in_backward_) return;
  const TensorSlot& slot = layout_->slot(i);
  if (stage_ == 2) {
    torch::NoGradGuard no_grad;
    torch::Tensor& staging = grad_chunks_[slot.chunk];
    if (!staging.defined()) staging = torch::zeros({layout_->chunk_numel(slot.chunk)}, param_chunks_[slot.chunk].options());
    staging.narrow(0, slot.offset, slot.numel).copy_(params_[i].grad().reshape(-1));
    params_[i].mutable_grad() = torch::Tensor();  // the whole gradient is not kept
  }
  if (!sync_) return;
  --pending_[slot.chunk];
  launch_ready_chunks();
}

void ZeroRedundancy::launch_ready_chunks() {
  // Chunks launch in index order on every rank, so the collectives match across ranks.
  while (next_to_launch_ < layout_->num_chunks() && pending_[next_to_launch_] == 0) launch(next_to_launch_++);
}

void ZeroRedundancy::launch(int64_t c) {
  torch::Tensor& source = grad_chunks_[c];
  if (!source.defined()) source = torch::zeros({layout_->chunk_numel(c)}, param_chunks_[c].options());
  in_flight_[c] = dist::reduce_scatter_async(source, *group_);
  if (stage_ == 2) source = torch::Tensor();  // the collective holds its own copy
}

void ZeroRedundancy::finish_backward() {
  if (in_backward_ && sync_) drain();
  in_backward_ = false;
}

void ZeroRedundancy::drain() {
  // Chunks holding a parameter that got no gradient this time have not launched yet.
  while (next_to_launch_ < layout_->num_chunks()) launch(next_to_launch_++);
  torch::NoGradGuard no_grad;
  const double inverse = 1.0 / group_->size();
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    grad_shards_[c].add_(in_flight_[c].wait().to(grad_shards_[c].scalar_type()), inverse);
  }
  in_backward_ = false;
}

void ZeroRedundancy::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& g : grad_shards_) g.zero_();
  if (stage_ == 1) {
    for (auto& g : grad_chunks_) g.zero_();
  }
}

void ZeroRedundancy::copy_masters_to_model() {
  torch::NoGradGuard no_grad;
  std::vector<dist::PendingTensor> gathers;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    gathers.push_back(dist::all_gather_async(master_shards_[c].to(dtype_), *group_));
  }
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) param_chunks_[c].copy_(gathers[c].wait());
}

io::NamedTensors ZeroRedundancy::full_weights() const {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> whole;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    const torch::Tensor chunk = dist::all_gather(master_shards_[c], *group_);
    for (int64_t i : layout_->tensors_in(c)) {
      whole[names_[i]] = chunk.narrow(0, layout_->slot(i).offset, params_[i].numel()).view(params_[i].sizes());
    }
  }
  io::NamedTensors out;
  for (const auto& item : model_.named_parameters()) {
    const auto found = whole.find(item.key());
    out.emplace_back(item.key(), found != whole.end() ? found->second : item.value());
  }
  for (const auto& item : model_.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

io::NamedTensors ZeroRedundancy::full_state(const io::NamedTensors& piece_state) const {
  torch::NoGradGuard no_grad;
  // Slots in the order they first appear; every rank holds the same names (one piece per parameter).
  std::vector<std::string> slots;
  std::map<std::string, torch::Tensor> by_name;
  io::NamedTensors out;
  for (const auto& [name, tensor] : piece_state) {
    const auto owner = optim::state_owner(name);
    if (!owner) {
      out.emplace_back(name, tensor);
      continue;
    }
    const std::string slot = name.substr(owner->size() + 1);
    if (std::find(slots.begin(), slots.end(), slot) == slots.end()) slots.push_back(slot);
    by_name[name] = tensor;
  }
  std::map<std::string, torch::Tensor> whole;
  for (const auto& slot : slots) {
    for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
      torch::Tensor shard = torch::zeros({layout_->shard_numel(c)}, master_shards_[c].options());
      for (int64_t i : layout_->tensors_in(c)) {
        const Piece piece = layout_->piece(i, rank_);
        const auto found = by_name.find(names_[i] + "/" + slot);
        KUAFU_CHECK(found != by_name.end(), "ZeRO: optimizer state lacks '", names_[i], "/", slot, "'");
        shard.narrow(0, piece.shard_offset, piece.numel).copy_(found->second.reshape(-1));
      }
      const torch::Tensor chunk = dist::all_gather(shard, *group_);
      for (int64_t i : layout_->tensors_in(c)) {
        whole[names_[i] + "/" + slot] =
            chunk.narrow(0, layout_->slot(i).offset, params_[i].numel()).view(params_[i].sizes());
      }
    }
  }
  for (const auto& [name, tensor] : piece_state) {
    if (optim::state_owner(name)) out.emplace_back(name, whole.at(name));
  }
  return out;
}

io::NamedTensors ZeroRedundancy::weights_to_load() const {
  std::set<std::string> chunked(names_.begin(), names_.end());
  io::NamedTensors out;
  for (const auto& item : model_.named_parameters()) {
    const torch::Tensor& p = item.value();
    out.emplace_back(item.key(), chunked.count(item.key())
                                     ? torch::empty(p.sizes(), master_shards_.front().options())
                                     : p);
  }
  for (const auto& item : model_.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

void ZeroRedundancy::load_full_weights(const io::NamedTensors& weights) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, full] : weights) {
    const auto found = std::find(names_.begin(), names_.end(), name);
    if (found == names_.end()) continue;  // buffers and frozen parameters were loaded in place
    const int64_t i = found - names_.begin();
    params_[i].copy_(full);
    const Piece piece = layout_->piece(i, rank_);
    master_shards_[layout_->slot(i).chunk]
        .narrow(0, piece.shard_offset, piece.numel)
        .copy_(full.reshape(-1).narrow(0, piece.tensor_offset, piece.numel));
  }
}

torch::Tensor ZeroRedundancy::piece_of(const std::string& name, const torch::Tensor& full) const {
  const int64_t i = index_of(name);
  KUAFU_CHECK(full.numel() == params_[i].numel(), "ZeRO: saved tensor for '", name, "' has ", full.numel(),
              " elements but the parameter has ", params_[i].numel());
  const Piece piece = layout_->piece(i, rank_);
  return full.reshape(-1).narrow(0, piece.tensor_offset, piece.numel);
}

int64_t ZeroRedundancy::model_state_bytes() const {
  int64_t bytes = 0;
  auto add = [&](const torch::Tensor& t) {
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  };
  for (const auto& t : param_chunks_) add(t);
  if (low_precision(dtype_)) {
    for (const auto& t : master_shards_) add(t);
  }
  for (const auto& t : grad_shards_) add(t);
  if (stage_ == 1) {
    for (const auto& t : grad_chunks_) add(t);
  }
  return bytes;
}

}  // namespace kuafu::memory

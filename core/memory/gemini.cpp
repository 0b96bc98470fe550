#include "core/memory/gemini.h"

#include "core/util/error.h"

namespace kuafu::memory {
namespace {

// The chunk's memory goes back to the allocator, but its storage object stays: the parameters and any
// views autograd saved keep pointing at it and see the data again once it is re-allocated and filled.
void free_storage(const torch::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

void allocate_storage(const torch::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

int64_t bytes_of(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

Gemini::Gemini(torch::nn::Module& model, dist::GroupPtr group, const GeminiOptions& options)
    : ChunkedMasters(model, std::move(group), trainable_names(model), options.chunk_numel, options.dtype),
      keep_payload_(group_->size() == 1) {
  torch::NoGradGuard no_grad;
  build_masters([&](int64_t c, const torch::Tensor& whole) {
    const int64_t shard = layout_->shard_numel(c);
    const torch::Tensor payload = whole.to(dtype_, /*non_blocking=*/false, /*copy=*/true);
    payloads_.push_back(payload);
    shards_.push_back(keep_payload_ ? payload : payload.narrow(0, rank_ * shard, shard).clone());
    // In the parameters' own precision the compute shard is the master; otherwise a float32 copy.
    return low_precision(dtype_) ? whole.narrow(0, rank_ * shard, shard).clone() : shards_.back();
  });
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    const TensorSlot& slot = layout_->slot(i);
    params_[i].set_data(payloads_[slot.chunk].narrow(0, slot.offset, slot.numel).view(shapes_[i]));
    params_[i].mutable_grad() = torch::Tensor();
    index_of_impl_[params_[i].unsafeGetTensorImpl()] = i;
  }
  const int64_t chunks = layout_->num_chunks();
  grad_staging_.resize(chunks);
  gathered_.assign(chunks, true);
  reduced_.assign(chunks, false);
  states_.assign(params_.size(), TensorState::kHold);
  grad_ready_.assign(params_.size(), false);
  for (int64_t c = 0; c < chunks; ++c) gathered_bytes_ += bytes_of(payloads_[c]);
  for (int64_t c = 0; c < chunks; ++c) release_if_idle(c);
  peak_gathered_bytes_ = gathered_bytes_;  // the peak counts from here, in training
  watch_gradients();
}

Gemini::~Gemini() = default;

std::string Gemini::describe() const {
  return detail::concat("Gemini (ZeRO-3 chunks): ", layout_->num_chunks(), " chunks of up to ",
                        layout_->largest_chunk_numel(), " elements over ", group_->size(), " ranks");
}

const std::vector<int64_t>& Gemini::tensors_of(const nn::BlockCall& call) {
  const auto cached = block_tensors_.find(call.name);
  if (cached != block_tensors_.end()) return cached->second;
  std::vector<int64_t> tensors;
  for (const torch::nn::Module* module : call.modules) {
    for (const auto& p : module->parameters()) {
      const auto found = index_of_impl_.find(p.unsafeGetTensorImpl());
      if (found != index_of_impl_.end() &&
          std::find(tensors.begin(), tensors.end(), found->second) == tensors.end()) {
        tensors.push_back(found->second);
      }
    }
  }
  return block_tensors_[call.name] = tensors;
}

void Gemini::move(int64_t i, TensorState to) {
  check_transition(names_[i], states_[i], to);
  states_[i] = to;
}

void Gemini::gather(int64_t c) {
  if (gathered_[c]) return;
  torch::NoGradGuard no_grad;
  allocate_storage(payloads_[c]);
  payloads_[c].copy_(dist::all_gather(shards_[c], *group_));
  gathered_[c] = true;
  gathered_bytes_ += bytes_of(payloads_[c]);
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  for (int64_t i : layout_->tensors_in(c)) move(i, TensorState::kHold);
}

void Gemini::release_if_idle(int64_t c) {
  if (keep_payload_ || !gathered_[c]) return;
  for (int64_t i : layout_->tensors_in(c)) {
    if (states_[i] != TensorState::kHold) return;
  }
  free_storage(payloads_[c]);
  gathered_[c] = false;
  gathered_bytes_ -= bytes_of(payloads_[c]);
  for (int64_t i : layout_->tensors_in(c)) move(i, TensorState::kFree);
}

void Gemini::pre_forward(const nn::BlockCall& call) { gather_for_compute(call); }

void Gemini::gather_for_compute(const nn::BlockCall& call) {
  for (int64_t i : tensors_of(call)) {
    gather(layout_->slot(i).chunk);
    move(i, TensorState::kCompute);
  }
}

void Gemini::post_forward(const nn::BlockCall& call) {
  const auto& tensors = tensors_of(call);
  for (int64_t i : tensors) move(i, TensorState::kHold);
  for (int64_t i : tensors) release_if_idle(layout_->slot(i).chunk);
}

void Gemini::pre_backward(const nn::BlockCall& call) { gather_for_compute(call); }

void Gemini::post_backward(const nn::BlockCall& call) {
  const auto& tensors = tensors_of(call);
  for (int64_t i : tensors) {
    move(i, TensorState::kHoldAfterBackward);
    if (grad_ready_[i]) move(i, TensorState::kReadyForReduce);
  }
  for (int64_t i : tensors) reduce_if_complete(layout_->slot(i).chunk);
}

void Gemini::on_grad_ready(int64_t i) {
  if (!in_backward_) return;  // a backward outside training leaves .grad to autograd
  const TensorSlot& slot = layout_->slot(i);
  move_grad_to_staging(i, grad_staging_[slot.chunk]);
  grad_ready_[i] = true;
  if (states_[i] == TensorState::kHoldAfterBackward) {
    move(i, TensorState::kReadyForReduce);
    reduce_if_complete(slot.chunk);
  }
}

void Gemini::reduce_if_complete(int64_t c) {
  if (reduced_[c]) return;
  for (int64_t i : layout_->tensors_in(c)) {
    if (states_[i] != TensorState::kReadyForReduce) return;
  }
  torch::NoGradGuard no_grad;
  torch::Tensor& staging = grad_staging_[c];
  if (!staging.defined()) staging = zero_chunk(c);
  grad_shards_[c].add_(dist::reduce_scatter(staging, *group_).to(master_dtype_), 1.0 / group_->size());
  staging = torch::Tensor();
  reduced_[c] = true;
  for (int64_t i : layout_->tensors_in(c)) move(i, TensorState::kHold);
  release_if_idle(c);
}

void Gemini::settle(int64_t i) {
  if (states_[i] == TensorState::kCompute) move(i, TensorState::kHoldAfterBackward);
  if (states_[i] == TensorState::kHoldAfterBackward) move(i, TensorState::kReadyForReduce);
}

void Gemini::begin_backward(bool /*sync*/) {
  // Every micro-step's gradients are reduced in its backward (whole gradients never persist): the
  // trainer calls finish_backward after the last micro-step only, so the previous one settles here.
  finish_backward();
  in_backward_ = true;
  reduced_.assign(reduced_.size(), false);
  grad_ready_.assign(grad_ready_.size(), false);
}

void Gemini::finish_backward() {
  if (!in_backward_) return;
  // Blocks whose input needs no gradient (the embeddings) get no post_backward, and a parameter unused in
  // this step gets no gradient: their chunks are reduced here, in chunk order on every rank.
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    if (reduced_[c]) continue;
    bool gathered_for_backward = false;
    for (int64_t i : layout_->tensors_in(c)) {
      settle(i);
      gathered_for_backward = gathered_for_backward || states_[i] == TensorState::kReadyForReduce;
    }
    if (!gathered_for_backward) continue;  // no gradient in this chunk (the same on every rank)
    // Tensors of the chunk that took no part in backward (HOLD) join the reduction as zeros.
    for (int64_t i : layout_->tensors_in(c)) {
      if (states_[i] == TensorState::kHold) {
        move(i, TensorState::kCompute);
        settle(i);
      }
    }
    reduce_if_complete(c);
  }
  in_backward_ = false;
}

void Gemini::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& g : grad_shards_) g.zero_();
}

void Gemini::copy_masters_to_model() {
  if (!low_precision(dtype_)) return;  // the compute shards are the masters
  torch::NoGradGuard no_grad;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) shards_[c].copy_(master_shards_[c]);
}

void Gemini::set_compute_weights(int64_t i, const torch::Tensor& full) {
  torch::NoGradGuard no_grad;
  const Piece piece = layout_->piece(i, rank_);
  const int64_t c = layout_->slot(i).chunk;
  if (keep_payload_) {
    params_[i].copy_(full);
  } else {
    shards_[c].narrow(0, piece.shard_offset, piece.numel).copy_(full.reshape(-1).narrow(0, piece.tensor_offset, piece.numel));
  }
}

}  // namespace kuafu::memory

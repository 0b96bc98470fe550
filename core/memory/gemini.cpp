#include "core/memory/gemini.h"

#include <algorithm>

#include "core/memory/storage_memory.h"
#include "core/util/error.h"

namespace kuafu::memory {

Gemini::Gemini(torch::nn::Module& model, dist::GroupPtr group, const GeminiOptions& options)
    : ChunkedMasters(model, std::move(group), trainable_names(model), options.chunk_numel, options.dtype,
                     options.grad_reduce, options.deferred, options.chunk_search_max),
      placement_(options.placement),
      fast_device_(device_),
      ledger_(options.placement.budgets),
      prefetch_stream_(fast_device_) {
  place_initially();
  if (options.disk) {
    KUAFU_CHECK(low_precision(dtype_), "Gemini's disk tier needs a bf16 or fp16 compute dtype: in float32 the compute "
                                       "shards are the masters");
    use_disk_tier(*options.disk, options.optimizer_slots);
    optimizer_slots_ = options.optimizer_slots;  // the masters' bytes count their state from the start
    state_counted_ = true;
    ledger_.add(Tier::kSlow, disk_staging_bytes(), "the disk tier's buffers for master chunks");
  }
  // What stays on each tier enters the ledger before anything is allocated: a model too large for the
  // budgets fails here, not after filling memory. Only a pinned chunk (its payload is its shard) stays
  // gathered. The auto policy puts on the device what host memory cannot hold.
  const int64_t chunks = layout_->num_chunks();
  for (int64_t c = 0; c < chunks; ++c) {
    if (placement_.auto_policy && !ledger_.fits(Tier::kSlow, shard_bytes(c))) shard_tier_[c] = Tier::kFast;
    if (!disk_ && placement_.auto_policy && !ledger_.fits(Tier::kSlow, shard_bytes(c) + master_bytes(c))) {
      master_tier_[c] = Tier::kFast;
    }
    pinned_.push_back(group_->size() == 1 && shard_tier_[c] == Tier::kFast);
    if (pinned_[c]) {
      ledger_.add(Tier::kFast, payload_bytes(c), detail::concat("chunk ", c));
    } else {
      ledger_.add(shard_tier_[c], shard_bytes(c), detail::concat("the compute shard of chunk ", c));
    }
    if (!disk_) ledger_.add(master_tier_[c], master_bytes(c), detail::concat("the masters of chunk ", c));
  }
  // With the disk tier the compute shards come first: host memory holds the master chunks that fit beside
  // them, in layout order, and the disk the rest.
  std::vector<bool> to_disk(chunks, false);
  if (disk_) {
    for (int64_t c = 0; c < chunks; ++c) {
      to_disk[c] = master_tier_[c] == Tier::kSlow && !ledger_.fits(Tier::kSlow, master_bytes(c));
      if (!to_disk[c]) ledger_.add(master_tier_[c], master_bytes(c), detail::concat("the masters of chunk ", c));
    }
    if (std::find(to_disk.begin(), to_disk.end(), true) == to_disk.end()) {
      ledger_.remove(Tier::kSlow, disk_staging_bytes());  // everything fits: no disk tier
      disk_.reset();
    }
  }
  torch::NoGradGuard no_grad;
  payloads_.resize(chunks);
  shards_.resize(chunks);
  // Each chunk's whole compute copy lives only while it is made (unless pinned): building holds no more
  // of the device than a gather does.
  build_masters([&](int64_t c, const torch::Tensor& whole) {
    const int64_t shard = layout_->shard_numel(c);
    payloads_[c] = whole.to(dtype_, /*non_blocking=*/false, /*copy=*/true);
    shards_[c] = pinned_[c] ? payloads_[c] : copy_to_tier(payloads_[c].narrow(0, rank_ * shard, shard), shard_tier_[c]);
    for (int64_t i : layout_->tensors_in(c)) {
      const TensorSlot& slot = layout_->slot(i);
      bind(i, payloads_[c].narrow(0, slot.offset, slot.numel));
      index_of_impl_[params_[i].unsafeGetTensorImpl()] = i;
    }
    if (!pinned_[c]) free_storage(payloads_[c]);
    // In the parameters' own precision the compute shard is the master; otherwise a float32 copy.
    if (to_disk[c]) return make_disk_record(c, whole.narrow(0, rank_ * shard, shard));
    return low_precision(dtype_) ? copy_to_tier(whole.narrow(0, rank_ * shard, shard), master_tier_[c]) : shards_[c];
  });
  grad_staging_.resize(chunks);
  gathered_.assign(chunks, false);
  arriving_.resize(chunks);
  reduced_.assign(chunks, false);
  states_.assign(params_.size(), TensorState::kFree);
  grad_ready_.assign(params_.size(), false);
  for (int64_t c = 0; c < chunks; ++c) {
    if (!pinned_[c]) continue;
    gathered_[c] = true;
    gathered_bytes_ += payload_bytes(c);
    for (int64_t i : layout_->tensors_in(c)) states_[i] = TensorState::kHold;
  }
  peak_gathered_bytes_ = gathered_bytes_;  // the peak counts from here, in training
  watch_gradients();
}

Gemini::~Gemini() = default;

const std::vector<int64_t>& Gemini::tensors_of(const hooks::BlockCall& call) {
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

std::vector<int64_t> Gemini::chunks_of(const hooks::BlockCall& call) {
  std::vector<int64_t> chunks;
  for (int64_t i : tensors_of(call)) {
    const int64_t c = layout_->slot(i).chunk;
    if (std::find(chunks.begin(), chunks.end(), c) == chunks.end()) chunks.push_back(c);
  }
  return chunks;
}

void Gemini::move(int64_t i, TensorState to) {
  check_transition(names_[i], states_[i], to);
  states_[i] = to;
}

void Gemini::gather(int64_t c) {
  if (gathered_[c]) return;
  torch::NoGradGuard no_grad;
  make_room(payload_bytes(c), in_use_chunks_);
  ledger_.add(Tier::kFast, payload_bytes(c), detail::concat("chunk ", c));
  allocate_storage(payloads_[c]);
  fill_payload(c);
  gathered_[c] = true;
  gathered_bytes_ += payload_bytes(c);
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  for (int64_t i : layout_->tensors_in(c)) move(i, TensorState::kHold);
}

void Gemini::fill_payload(int64_t c) {
  torch::NoGradGuard no_grad;
  if (group_->size() == 1) {
    payloads_[c].copy_(shards_[c]);
  } else {
    payloads_[c].copy_(dist::all_gather(shards_[c].to(fast_device_), *group_));
  }
}

bool Gemini::idle(int64_t c) const {
  for (int64_t i : layout_->tensors_in(c)) {
    if (states_[i] != TensorState::kHold) return false;
  }
  return true;
}

void Gemini::release(int64_t c) {
  if (pinned_[c] || !gathered_[c]) return;
  arriving_[c].reset();  // its memory belongs to the side stream, which reuses it only after the copy
  free_storage(payloads_[c]);
  gathered_[c] = false;
  gathered_bytes_ -= payload_bytes(c);
  ledger_.remove(Tier::kFast, payload_bytes(c));
  for (int64_t i : layout_->tensors_in(c)) move(i, TensorState::kFree);
}

void Gemini::release_if_idle(int64_t c) {
  if (keeps_chunks()) return;  // kept on the device until their room is needed
  if (idle(c)) release(c);
}

void Gemini::pre_forward(const hooks::BlockCall& call) { gather_for_compute(call, /*backward=*/false); }

void Gemini::pre_backward(const hooks::BlockCall& call) { gather_for_compute(call, /*backward=*/true); }

void Gemini::gather_for_compute(const hooks::BlockCall& call, bool backward) {
  const std::vector<int64_t> chunks = chunks_of(call);
  begin_call(call, backward, chunks);
  for (int64_t i : tensors_of(call)) {
    gather(layout_->slot(i).chunk);
    move(i, TensorState::kCompute);
  }
  for (int64_t c : chunks) take_arrival(c);
  // The next block's chunks come while this one computes.
  if (keeps_chunks()) prefetch_next_call();
  if (compute_peak_) {  // warm-up: what the block allocates from here on, temporaries included
    compute_model_bytes_ = model_bytes_in_use_counts();
    compute_peak_->restart();
  }
}

void Gemini::post_forward(const hooks::BlockCall& call) {
  sample_non_model();  // the block's activations are all there now
  const auto& tensors = tensors_of(call);
  for (int64_t i : tensors) move(i, TensorState::kHold);
  for (int64_t i : tensors) release_if_idle(layout_->slot(i).chunk);
  end_call();
}

void Gemini::post_backward(const hooks::BlockCall& call) {
  sample_non_model();
  const auto& tensors = tensors_of(call);
  for (int64_t i : tensors) {
    move(i, TensorState::kHoldAfterBackward);
    if (grad_ready_[i]) move(i, TensorState::kReadyForReduce);
  }
  for (int64_t i : tensors) reduce_if_complete(layout_->slot(i).chunk);
  end_call();
}

torch::Tensor& Gemini::staging_for(int64_t c) {
  torch::Tensor& staging = grad_staging_[c];
  if (!staging.defined()) {
    make_room(payload_bytes(c), in_use_chunks_);
    ledger_.add(Tier::kFast, payload_bytes(c), detail::concat("the gradients of chunk ", c));
    staging = zero_chunk(c);
  }
  return staging;
}

void Gemini::on_grad_ready(int64_t i) {
  if (!in_backward_) return;  // a backward outside training leaves .grad to autograd
  const TensorSlot& slot = layout_->slot(i);
  move_grad_to_staging(i, staging_for(slot.chunk));
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
  torch::Tensor& staging = staging_for(c);
  // On one rank the buffer is its own reduction (no copy).
  add_reduced_grads(c, group_->trivial() ? staging : dist::reduce_scatter(for_reduction(staging), *group_));
  staging = torch::Tensor();
  ledger_.remove(Tier::kFast, payload_bytes(c));
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
  settle_backward();
  tracing_ = !warmed_up_ && micro_steps_seen_ == 0;  // the warm-up trace is the first micro-step
  if (tracing_ && tracks_memory()) compute_peak_ = std::make_unique<PeakInUse>(fast_device_);
  ++micro_steps_seen_;
  next_call_ = 0;
  in_backward_ = true;
  reduced_.assign(reduced_.size(), false);
  grad_ready_.assign(grad_ready_.size(), false);
}

void Gemini::finish_backward() {
  settle_backward();
  if (!warmed_up_ && micro_steps_seen_ > 0) finish_warm_up();
}

void Gemini::end_backward_pass() {
  if (!in_backward_) return;  // a backward outside training
  reduce_owed();
  // The next pass's gradients are staged and reduced afresh; the warm-up trace goes on through the step.
  reduced_.assign(reduced_.size(), false);
  grad_ready_.assign(grad_ready_.size(), false);
}

void Gemini::settle_backward() {
  if (!in_backward_) return;
  reduce_owed();
  in_backward_ = false;
  tracing_ = false;
  compute_peak_.reset();
  compute_model_bytes_.reset();
}

void Gemini::reduce_owed() {
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
}

void Gemini::zero_grad() {
  torch::NoGradGuard no_grad;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    if (!chunk_on_disk(c)) grad_shards_[c].zero_();
  }
  zero_disk_grads();
}

void Gemini::copy_masters_to_model() {
  if (!low_precision(dtype_)) return;  // the compute shards are the masters
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    if (!chunk_on_disk(c)) master_stepped(c);
  }
}

void Gemini::master_stepped(int64_t c) {
  torch::NoGradGuard no_grad;
  shards_[c].copy_(master_shards_[c]);
  // A chunk kept gathered on the device takes the new weights too (the same chunks on every rank).
  if (!gathered_[c] || pinned_[c]) return;
  take_arrival(c);
  fill_payload(c);
}

void Gemini::set_compute_weights(int64_t i, const torch::Tensor& full) {
  torch::NoGradGuard no_grad;
  const Piece piece = layout_->piece(i, rank_);
  const int64_t c = layout_->slot(i).chunk;
  if (pinned_[c]) {
    params_[i].copy_(full);
    return;
  }
  shards_[c].narrow(0, piece.shard_offset, piece.numel).copy_(full.reshape(-1).narrow(0, piece.tensor_offset, piece.numel));
  if (gathered_[c]) params_[i].copy_(full);
}

}  // namespace kuafu::memory

#include "core/memory/zero.h"

#include "core/hooks/grad_ready.h"
#include "core/util/error.h"

namespace kuafu::memory {
namespace {

// Reverse registration order: roughly the order backward produces gradients.
std::vector<std::string> reversed(std::vector<std::string> names) { return {names.rbegin(), names.rend()}; }

}  // namespace

ZeroRedundancy::ZeroRedundancy(torch::nn::Module& model, dist::GroupPtr group, const ZeroOptions& options)
    : ChunkedMasters(model, std::move(group), reversed(trainable_names(model)), options.chunk_numel, options.dtype,
                     options.grad_reduce, options.deferred),
      stage_(options.stage) {
  KUAFU_CHECK(stage_ == 1 || stage_ == 2, "ZeRO stage must be 1 or 2, got ", stage_);
  torch::NoGradGuard no_grad;
  param_chunks_.resize(layout_->num_chunks());
  build_masters([&](int64_t c, const torch::Tensor& whole) {
    const int64_t shard = layout_->shard_numel(c);
    param_chunks_[c] = low_precision(dtype_) ? whole.to(dtype_) : whole;
    for (int64_t i : layout_->tensors_in(c)) {
      bind(i, param_chunks_[c].narrow(0, layout_->slot(i).offset, layout_->slot(i).numel));
    }
    // In the parameters' own precision the chunk itself is the master.
    return low_precision(dtype_) ? whole.narrow(0, rank_ * shard, shard).clone() : whole.narrow(0, rank_ * shard, shard);
  });
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    grad_chunks_.push_back(stage_ == 1 ? zero_chunk(c).to(grad_dtype_) : torch::Tensor());
  }
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    const TensorSlot& slot = layout_->slot(i);
    torch::Tensor& param = params_[i];
    // Stage 2 copies each gradient out in the hook. Stage 1 accumulates into the whole gradient chunk: in
    // place as .grad where the chunk has the compute dtype, else (float32 main gradients) added in after
    // each backward, before on_grad_ready counts it.
    if (stage_ == 1) {
      torch::Tensor grad = grad_chunks_[slot.chunk].narrow(0, slot.offset, slot.numel).view(shapes_[i]);
      if (grad_dtype_ == dtype_) {
        param.mutable_grad() = grad;
      } else {
        accumulators_.push_back(hooks::accumulate_into_main_grad(param, grad));
      }
    }
  }
  pending_.assign(layout_->num_chunks(), 0);
  in_flight_.resize(layout_->num_chunks());
  watch_gradients();
}

ZeroRedundancy::~ZeroRedundancy() = default;

void ZeroRedundancy::begin_backward(bool sync) {
  // Stage 2 keeps no whole gradients: every micro-step's gradients leave during its backward, and the
  // previous micro-step's reductions land in the shards before this one starts.
  finish_backward();
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
  if (stage_ == 2) move_grad_to_staging(i, grad_chunks_[slot.chunk]);
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
  if (!source.defined()) source = zero_chunk(c);
  in_flight_[c] = dist::reduce_scatter_async(for_reduction(source), *group_);
  if (stage_ == 2) source = torch::Tensor();  // the collective holds its own copy
}

void ZeroRedundancy::finish_backward() {
  if (in_backward_ && sync_) drain();
  in_backward_ = false;
}

void ZeroRedundancy::reduce_accumulated() {
  KUAFU_CHECK(stage_ == 1, "a pipeline step reduces accumulated whole gradients: ZeRO stage 1, not ", stage_);
  sync_ = true;
  finish_backward();  // every chunk launches now, in chunk order on every rank
}

void ZeroRedundancy::drain() {
  // Chunks holding a parameter that got no gradient this time have not launched yet.
  while (next_to_launch_ < layout_->num_chunks()) launch(next_to_launch_++);
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) add_reduced_grads(c, in_flight_[c].wait());
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

void ZeroRedundancy::set_compute_weights(int64_t i, const torch::Tensor& full) { params_[i].copy_(full); }

std::string ZeroRedundancy::describe() const {
  return detail::concat("ZeRO stage ", stage_, ": ", layout_->num_chunks(), " chunks of up to ",
                        layout_->largest_chunk_numel(), " elements over ", group_->size(), " ranks");
}

}  // namespace kuafu::memory

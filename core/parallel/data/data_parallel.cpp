#include "core/parallel/data/data_parallel.h"

#include "core/nn/grad_ready.h"
#include "core/util/error.h"

namespace kuafu::parallel {

DataParallel::DataParallel(torch::nn::Module& model, dist::GroupPtr group, int64_t bucket_bytes)
    : group_(std::move(group)) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.requires_grad()) params_.push_back(p);
  }
  for (auto p : model.parameters()) dist::broadcast(p, *group_, 0);
  for (auto b : model.buffers()) dist::broadcast(b, *group_, 0);

  // Reverse registration order approximates the order gradients become ready in backward.
  bucket_of_.assign(params_.size(), -1);
  int64_t bytes = 0;
  for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
    const torch::Tensor& p = params_[i];
    const int64_t p_bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const bool fits = !buckets_.empty() && bytes + p_bytes <= bucket_bytes &&
                      params_[buckets_.back().params.front()].scalar_type() == p.scalar_type();
    if (!fits) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().params.push_back(i);
    bucket_of_[i] = static_cast<int64_t>(buckets_.size()) - 1;
    bytes += p_bytes;
  }
  for (auto& bucket : buckets_) {
    int64_t numel = 0;
    for (int64_t i : bucket.params) numel += params_[i].numel();
    const torch::Tensor& first = params_[bucket.params.front()];
    bucket.buffer = torch::zeros({numel}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (int64_t i : bucket.params) {
      torch::Tensor& p = params_[i];
      p.mutable_grad() = bucket.buffer.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
    }
  }
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    accumulators_.push_back(nn::on_grad_accumulated(params_[i], [this, i] { on_grad_ready(i); }));
  }
}

DataParallel::~DataParallel() {
  // Leave no reduction in flight that would write into freed buckets.
  for (auto& bucket : buckets_) {
    try {
      bucket.reduction.wait();
    } catch (...) {
    }
  }
}

void DataParallel::begin_backward(bool sync) {
  KUAFU_CHECK(!in_backward_ || !sync_, "DataParallel: finish_backward() was not called after the last backward");
  sync_ = sync;
  in_backward_ = true;
  next_to_launch_ = 0;
  for (auto& bucket : buckets_) {
    bucket.pending = static_cast<int64_t>(bucket.params.size());
    bucket.launched = false;
  }
}

void DataParallel::on_grad_ready(int64_t param_index) {
  if (!in_backward_ || !sync_) return;
  Bucket& bucket = buckets_[bucket_of_[param_index]];
  bucket.pending -= 1;
  if (bucket.pending == 0) launch_ready_buckets();
}

void DataParallel::launch_ready_buckets() {
  while (next_to_launch_ < num_buckets() && buckets_[next_to_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_to_launch_];
    bucket.reduction = dist::all_reduce_async(bucket.buffer, *group_);
    bucket.launched = true;
    ++next_to_launch_;
  }
}

void DataParallel::finish_backward() {
  KUAFU_CHECK(in_backward_ && sync_, "DataParallel::finish_backward() without a syncing begin_backward()");
  // Buckets with parameters unused by this graph never filled: launch them now, in order.
  for (auto& bucket : buckets_) bucket.pending = 0;
  launch_ready_buckets();
  const double scale = 1.0 / group_->size();
  for (auto& bucket : buckets_) {
    bucket.reduction.wait();
    if (group_->size() > 1) bucket.buffer.mul_(scale);
  }
  in_backward_ = false;
}

void DataParallel::reduce_now() {
  begin_backward(/*sync=*/true);
  finish_backward();  // launches the buckets that no backward filled: here, all of them
}

void DataParallel::zero_grad() {
  for (auto& bucket : buckets_) bucket.buffer.zero_();
}

}  // namespace kuafu::parallel

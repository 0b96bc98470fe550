#include "core/parallel/data/data_parallel.h"

#include "core/hooks/grad_ready.h"
#include "core/util/error.h"

namespace kuafu::parallel {

DataParallel::DataParallel(torch::nn::Module& model, dist::GroupPtr group, const DataParallelOptions& options)
    : group_(std::move(group)) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names_.push_back(item.key());
    params_.push_back(item.value());
  }
  for (auto p : model.parameters()) dist::broadcast(p, *group_, 0);
  for (auto b : model.buffers()) dist::broadcast(b, *group_, 0);

  // Reverse registration order approximates the order gradients become ready in backward.
  std::vector<torch::Dtype> grad_dtypes;
  for (const auto& p : params_) grad_dtypes.push_back(optim::grad_dtype(p.scalar_type(), options.grad_reduce));
  bucket_of_.assign(params_.size(), -1);
  int64_t bytes = 0;
  for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
    const int64_t p_bytes = params_[i].numel() * static_cast<int64_t>(torch::elementSize(grad_dtypes[i]));
    const bool fits = !buckets_.empty() && bytes + p_bytes <= options.bucket_bytes &&
                      grad_dtypes[buckets_.back().params.front()] == grad_dtypes[i];
    if (!fits) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().params.push_back(i);
    bucket_of_[i] = static_cast<int64_t>(buckets_.size()) - 1;
    bytes += p_bytes;
  }
  grads_.resize(params_.size());
  for (auto& bucket : buckets_) {
    int64_t numel = 0;
    for (int64_t i : bucket.params) numel += params_[i].numel();
    const int64_t first = bucket.params.front();
    bucket.buffer = torch::zeros({numel}, params_[first].options().dtype(grad_dtypes[first]).requires_grad(false));
    int64_t offset = 0;
    for (int64_t i : bucket.params) {
      torch::Tensor& p = params_[i];
      grads_[i] = bucket.buffer.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      if (grads_[i].scalar_type() == p.scalar_type()) {
        p.mutable_grad() = grads_[i];
      } else {
        p.mutable_grad() = torch::Tensor();
        // Registered before on_grad_ready's hook below: the bucket holds the gradient when it counts.
        accumulators_.push_back(hooks::accumulate_into_main_grad(p, grads_[i]));
      }
    }
  }
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    accumulators_.push_back(hooks::on_grad_accumulated(params_[i], [this, i] { on_grad_ready(i); }));
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
    const double before_sum = optim::grad_average(bucket.buffer.scalar_type(), group_->size()).before_sum;
    if (before_sum != 1.0) bucket.buffer.mul_(before_sum);
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
  for (auto& bucket : buckets_) {
    bucket.reduction.wait();
    const double after_sum = optim::grad_average(bucket.buffer.scalar_type(), group_->size()).after_sum;
    if (after_sum != 1.0) bucket.buffer.mul_(after_sum);
  }
  in_backward_ = false;
}

void DataParallel::reduce_now() {
  begin_backward(/*sync=*/true);
  finish_backward();  // launches the buckets that no backward filled: here, all of them
}

io::NamedTensors DataParallel::grads() const {
  io::NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(names_[i], grads_[i]);
  return out;
}

void DataParallel::zero_grad() {
  for (auto& bucket : buckets_) bucket.buffer.zero_();
}

}  // namespace kuafu::parallel

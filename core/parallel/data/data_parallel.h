// Data parallelism: gradients live in size-bounded flat buckets and each bucket's all-reduce starts
// asynchronously during backward as soon as all of its gradients are ready.
#pragma once

#include <memory>
#include <vector>

#include "core/dist/collectives.h"

namespace kuafu::parallel {

class DataParallel {
 public:
  // Broadcasts rank 0's parameters and buffers, then points every parameter's .grad at a view of
  // its bucket (so accumulation happens in place and nothing is copied before the all-reduce).
  DataParallel(torch::nn::Module& model, dist::GroupPtr group, int64_t bucket_bytes = 25 << 20);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Call before each micro-step's backward. `sync` false (gradient accumulation): no communication.
  void begin_backward(bool sync);
  // Call after the last micro-step's backward: waits for every bucket and averages over the group.
  void finish_backward();
  // All-reduces every bucket now and waits (averaged over the group). For schedules whose micro-batches'
  // backwards interleave, like pipelines: run them after begin_backward(false), then call this.
  void reduce_now();
  // Zeroes the gradient buckets in place (never frees them: .grad must stay a bucket view).
  void zero_grad();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  const dist::ProcessGroup& group() const { return *group_; }

 private:
  struct Bucket {
    torch::Tensor buffer;              // [numel of its parameters], flat
    std::vector<int64_t> params;       // indices into params_
    int64_t pending = 0;               // gradients not yet ready in this backward
    dist::PendingAllReduce reduction;  // in flight after launch
    bool launched = false;
  };

  void on_grad_ready(int64_t param_index);
  void launch_ready_buckets();

  dist::GroupPtr group_;
  std::vector<torch::Tensor> params_;
  std::vector<int64_t> bucket_of_;  // param index -> bucket index
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keep hooks alive
  int64_t next_to_launch_ = 0;  // buckets launch in index order on every rank
  bool sync_ = true;
  bool in_backward_ = false;
};

}  // namespace kuafu::parallel

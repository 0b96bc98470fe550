// Data parallelism: gradients live in size-bounded flat buckets and each bucket's all-reduce starts
// asynchronously during backward as soon as all of its gradients are ready. Under bf16/fp16 the buckets
// are float32 (Megatron's main_grad) unless precision.grad_reduce = "compute".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/dist/collectives.h"
#include "core/optim/mixed_precision.h"

namespace kuafu::parallel {

struct DataParallelOptions {
  int64_t bucket_bytes = 25 << 20;  // gradient bytes per all-reduce (in the buckets' dtype)
  optim::GradReduce grad_reduce = optim::GradReduce::kFloat32;
};

class DataParallel {
 public:
  // Broadcasts rank 0's parameters and buffers and lays the gradients out in buckets. A parameter whose
  // gradients accumulate in its own dtype (float32 training, or grad_reduce kCompute) gets a view of its
  // bucket as .grad, so accumulation happens in place and nothing is copied before the all-reduce. A
  // bf16/fp16 parameter otherwise keeps no .grad: each backward's gradient is added into its float32
  // bucket view (hooks::accumulate_into_main_grad), so accumulation and the all-reduce run in float32.
  DataParallel(torch::nn::Module& model, dist::GroupPtr group, const DataParallelOptions& options = {});
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
  // Zeroes the gradient buckets in place (never frees them: the gradients must stay bucket views).
  void zero_grad();

  // Each trainable parameter's gradient under its name: its bucket view (its .grad, or its float32 main
  // gradient), averaged over the group after finish_backward.
  io::NamedTensors grads() const;
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  const dist::ProcessGroup& group() const { return *group_; }

 private:
  struct Bucket {
    torch::Tensor buffer;              // [numel of its parameters], flat, in its gradients' dtype
    std::vector<int64_t> params;       // indices into params_
    int64_t pending = 0;               // gradients not yet ready in this backward
    dist::PendingAllReduce reduction;  // in flight after launch
    bool launched = false;
  };

  void on_grad_ready(int64_t param_index);
  void launch_ready_buckets();

  dist::GroupPtr group_;
  std::vector<std::string> names_;  // trainable parameters, registration order
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> grads_;  // [param] its view of its bucket, param-shaped
  std::vector<int64_t> bucket_of_;    // param index -> bucket index
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keep hooks alive
  int64_t next_to_launch_ = 0;  // buckets launch in index order on every rank
  bool sync_ = true;
  bool in_backward_ = false;
};

}  // namespace kuafu::parallel

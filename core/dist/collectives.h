// Collectives as plain functions over a ProcessGroup, the same on Gloo (CPU tensors) and NCCL (GPU
// tensors): every tensor must already be on its group's device. All are the backends' native operations.
#pragma once

#include <functional>

#include "core/dist/process_group.h"

namespace kuafu::dist {

enum class Reduce { kSum, kAvg, kMax, kMin };

// In place on every rank of the group. kAvg divides the sum by the group size.
void all_reduce(torch::Tensor& tensor, const ProcessGroup& group, Reduce op = Reduce::kSum);

// Starts an in-place sum all-reduce and returns at once; call wait() before reading `tensor`.
class PendingAllReduce {
 public:
  PendingAllReduce() = default;
  PendingAllReduce(const ProcessGroup* group, torch::Tensor tensor, torch::Tensor staging,
                   c10::intrusive_ptr<compat::Work> work);
  void wait();
  bool active() const { return group_ != nullptr; }

 private:
  const ProcessGroup* group_ = nullptr;
  torch::Tensor tensor_;
  torch::Tensor staging_;  // fp32 copy when the dtype cannot travel on Gloo
  c10::intrusive_ptr<compat::Work> work_;
};
PendingAllReduce all_reduce_async(torch::Tensor tensor, const ProcessGroup& group);

// A collective that has started and not finished: wait() blocks until it completes and returns its
// result (an emulation's local step, e.g. the sum of a reduce-scatter, runs there). Until then the
// caller may compute: the transfer overlaps it.
class PendingTensor {
 public:
  PendingTensor() = default;
  PendingTensor(const ProcessGroup* group, c10::intrusive_ptr<compat::Work> work, const char* what,
                std::function<torch::Tensor()> finish)
      : group_(group), work_(std::move(work)), what_(what), finish_(std::move(finish)) {}
  torch::Tensor wait();  // once
  bool active() const { return static_cast<bool>(finish_); }

 private:
  const ProcessGroup* group_ = nullptr;
  c10::intrusive_ptr<compat::Work> work_;  // null for a group of one
  const char* what_ = "";
  std::function<torch::Tensor()> finish_;
};

// Concatenation of every rank's `tensor` along `dim` (all ranks pass equal shapes).
torch::Tensor all_gather(const torch::Tensor& tensor, const ProcessGroup& group, int64_t dim = 0);
PendingTensor all_gather_async(const torch::Tensor& tensor, const ProcessGroup& group, int64_t dim = 0);

// Sum over ranks of `tensor`, split along `dim` into group-size equal parts; rank r keeps part r.
torch::Tensor reduce_scatter(const torch::Tensor& tensor, const ProcessGroup& group, int64_t dim = 0);
PendingTensor reduce_scatter_async(const torch::Tensor& tensor, const ProcessGroup& group, int64_t dim = 0);

// Splits `tensor` along `split_dim` into group-size parts, sends part j to rank j, and concatenates
// the parts received (in rank order) along `concat_dim`.
torch::Tensor all_to_all(const torch::Tensor& tensor, const ProcessGroup& group, int64_t split_dim,
                         int64_t concat_dim);
PendingTensor all_to_all_async(const torch::Tensor& tensor, const ProcessGroup& group, int64_t split_dim,
                               int64_t concat_dim);

// In place: every rank ends with group rank `root`'s tensor.
void broadcast(torch::Tensor& tensor, const ProcessGroup& group, int root = 0);

// In place on group rank `root`: the reduction over the group of every rank's `tensor`. The other
// ranks' tensors are scratch afterwards (the backend may overwrite them); pass a copy to keep one.
// About half the bytes of an all-reduce, for results only one rank needs (e.g. SUMMA's gradient blocks).
void reduce(torch::Tensor& tensor, const ProcessGroup& group, int root, Reduce op = Reduce::kSum);

// Point to point, blocking; `peer` is a rank inside the group.
void send(const torch::Tensor& tensor, const ProcessGroup& group, int peer, int tag = 0);
void recv(torch::Tensor& tensor, const ProcessGroup& group, int peer, int tag = 0);
// Starts receiving into a tensor shaped and typed like `like`; wait() returns it.
PendingTensor recv_async(const torch::Tensor& like, const ProcessGroup& group, int peer, int tag = 0);

// A send that returns at once (pipelines post sends and move on: two neighbours that both sent before
// receiving would otherwise wait on each other). The wire copy lives in the handle; wait() before the
// end of the step, and before changing `tensor` when it travels as is.
class PendingSend {
 public:
  PendingSend() = default;
  PendingSend(const ProcessGroup* group, torch::Tensor wire, c10::intrusive_ptr<compat::Work> work)
      : group_(group), wire_(std::move(wire)), work_(std::move(work)) {}
  void wait();
  bool completed() const;  // delivered (or failed: wait() then says how); its buffer can go

 private:
  const ProcessGroup* group_ = nullptr;
  torch::Tensor wire_;
  c10::intrusive_ptr<compat::Work> work_;
};
PendingSend send_async(const torch::Tensor& tensor, const ProcessGroup& group, int peer, int tag = 0);

// Point-to-point messages posted together; messages from one rank to another match by order (no
// tags), as on NCCL. Receives fill their tensors in place before this returns. On NCCL the messages run
// as one group and all complete here (two ranks sending to each other cannot block each other); on
// Gloo sends complete on their own and come back pending (wait for them before the step ends).
struct Message {
  torch::Tensor tensor;
  int peer;   // a rank inside the group
  bool send;  // false: receive into `tensor`
};
std::vector<PendingSend> exchange(const std::vector<Message>& messages, const ProcessGroup& group);

void barrier(const ProcessGroup& group);

}  // namespace kuafu::dist

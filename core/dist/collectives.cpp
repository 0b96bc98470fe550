#include "core/dist/collectives.h"

#include "core/util/error.h"

namespace kuafu::dist {
namespace {

c10d::ReduceOp to_c10d(Reduce op) {
  switch (op) {
    case Reduce::kSum:
    case Reduce::kAvg: return c10d::ReduceOp::SUM;
    case Reduce::kMax: return c10d::ReduceOp::MAX;
    case Reduce::kMin: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

int64_t bytes_of(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// The tensor that actually travels: contiguous, on the group's device (Gloo: CPU, NCCL: the rank's GPU).
// Gloo since LibTorch 2.x reduces bf16 and fp16 itself, so every dtype travels as it is.
torch::Tensor wire_tensor(const torch::Tensor& tensor, const ProcessGroup& group) {
  KUAFU_CHECK(tensor.device() == group.device(), "collective on group '", group.name(), "' expects tensors on ",
              group.device(), " but got one on ", tensor.device());
  return tensor.contiguous();
}

// An all-reduce is accounted as the bandwidth-optimal ring (reduce-scatter then all-gather): each rank
// sends and receives 2 (p - 1) / p of the tensor, whatever algorithm the backend picks.
void count_all_reduce(const torch::Tensor& tensor, const ProcessGroup& group) {
  const int64_t p = group.size();
  group.count(2 * bytes_of(tensor) / p * (p - 1), 2 * bytes_of(tensor) / p * (p - 1));
}

// Copies the wire result back into `tensor` when they are different storage.
void copy_back(torch::Tensor& tensor, const torch::Tensor& wire) {
  if (!wire.is_same(tensor)) tensor.copy_(wire);
}

}  // namespace

void all_reduce(torch::Tensor& tensor, const ProcessGroup& group, Reduce op) {
  if (group.trivial()) return;
  torch::Tensor wire = wire_tensor(tensor, group);
  std::vector<torch::Tensor> tensors{wire};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  group.wait(group.backend().allreduce(tensors, options), "all_reduce");
  count_all_reduce(tensor, group);
  if (op == Reduce::kAvg) wire.div_(group.size());
  copy_back(tensor, wire);
}

PendingAllReduce::PendingAllReduce(const ProcessGroup* group, torch::Tensor tensor, torch::Tensor staging,
                                   c10::intrusive_ptr<compat::Work> work)
    : group_(group), tensor_(std::move(tensor)), staging_(std::move(staging)), work_(std::move(work)) {}

void PendingAllReduce::wait() {
  if (!group_) return;
  if (work_) group_->wait(work_, "all_reduce");
  if (staging_.defined()) tensor_.copy_(staging_);
  group_ = nullptr;
}

PendingAllReduce all_reduce_async(torch::Tensor tensor, const ProcessGroup& group) {
  if (group.trivial()) return PendingAllReduce(&group, tensor, {}, {});
  KUAFU_CHECK(tensor.is_contiguous(), "all_reduce_async needs a contiguous tensor");
  torch::Tensor wire = wire_tensor(tensor, group);
  std::vector<torch::Tensor> tensors{wire};
  auto work = group.backend().allreduce(tensors, c10d::AllreduceOptions());
  count_all_reduce(tensor, group);
  return PendingAllReduce(&group, tensor, wire.is_same(tensor) ? torch::Tensor() : wire, work);
}

torch::Tensor PendingTensor::wait() {
  KUAFU_CHECK(active(), "PendingTensor::wait called twice or on nothing");
  if (work_) group_->wait(work_, what_);
  torch::Tensor result = finish_();
  finish_ = nullptr;
  work_.reset();
  return result;
}

torch::Tensor all_gather(const torch::Tensor& tensor, const ProcessGroup& group, int64_t dim) {
  return all_gather_async(tensor, group, dim).wait();
}

PendingTensor all_gather_async(const torch::Tensor& tensor, const ProcessGroup& group, int64_t dim) {
  if (group.trivial()) return PendingTensor(&group, {}, "all_gather", [tensor] { return tensor.clone(); });
  torch::Tensor wire = wire_tensor(tensor, group);
  const int64_t p = group.size();
  const int64_t d = dim < 0 ? dim + tensor.dim() : dim;
  group.count(bytes_of(tensor) * (p - 1), bytes_of(tensor) * (p - 1));
  // Flat buffers: Gloo checks that the output splits along its first dimension into inputs' shapes.
  // The result concatenates the rank blocks along `dim`.
  torch::Tensor flat = wire.reshape({-1});
  torch::Tensor gathered = torch::empty({p * flat.numel()}, wire.options());
  auto work = group.backend()._allgather_base(gathered, flat);
  auto sizes = wire.sizes().vec();
  sizes.insert(sizes.begin(), p);
  return PendingTensor(&group, work, "all_gather", [gathered, flat, sizes, d] {
    return torch::cat(gathered.view(sizes).unbind(0), d);
  });
}

torch::Tensor reduce_scatter(const torch::Tensor& tensor, const ProcessGroup& group, int64_t dim) {
  return reduce_scatter_async(tensor, group, dim).wait();
}

PendingTensor reduce_scatter_async(const torch::Tensor& tensor, const ProcessGroup& group, int64_t dim) {
  if (group.trivial()) return PendingTensor(&group, {}, "reduce_scatter", [tensor] { return tensor.clone(); });
  const int64_t p = group.size();
  const int64_t d = dim < 0 ? dim + tensor.dim() : dim;
  KUAFU_CHECK(tensor.size(d) % p == 0, "reduce_scatter: dim ", d, " of size ", tensor.size(d),
              " does not divide by the group size ", p, " (group '", group.name(), "')");
  // Rank-major layout [p, chunk...] so part j is contiguous.
  torch::Tensor wire = wire_tensor(torch::stack(tensor.chunk(p, d), 0), group);
  group.count(bytes_of(tensor) / p * (p - 1), bytes_of(tensor) / p * (p - 1));
  // Flat buffers, as for all-gather: part j is the j-th p-th of the input.
  torch::Tensor flat = wire.reshape({-1});
  torch::Tensor result = torch::empty({flat.numel() / p}, wire.options());
  auto work = group.backend()._reduce_scatter_base(result, flat);
  const auto part_sizes = wire[0].sizes().vec();
  return PendingTensor(&group, work, "reduce_scatter", [result, flat, part_sizes] { return result.view(part_sizes); });
}

torch::Tensor all_to_all(const torch::Tensor& tensor, const ProcessGroup& group, int64_t split_dim,
                         int64_t concat_dim) {
  return all_to_all_async(tensor, group, split_dim, concat_dim).wait();
}

PendingTensor all_to_all_async(const torch::Tensor& tensor, const ProcessGroup& group, int64_t split_dim,
                               int64_t concat_dim) {
  const int64_t p = group.size();
  const int64_t s = split_dim < 0 ? split_dim + tensor.dim() : split_dim;
  const int64_t c = concat_dim < 0 ? concat_dim + tensor.dim() : concat_dim;
  KUAFU_CHECK(tensor.size(s) % p == 0, "all_to_all: dim ", s, " of size ", tensor.size(s),
              " does not divide by the group size ", p, " (group '", group.name(), "')");
  if (group.trivial()) return PendingTensor(&group, {}, "all_to_all", [tensor] { return tensor.clone(); });
  torch::Tensor wire = wire_tensor(torch::stack(tensor.chunk(p, s), 0), group);  // [p, ...]: part j to rank j
  torch::Tensor received = torch::empty_like(wire);
  std::vector<int64_t> equal_splits;
  auto work = group.backend().alltoall_base(received, wire, equal_splits, equal_splits);
  group.count(bytes_of(tensor) / p * (p - 1), bytes_of(tensor) / p * (p - 1));
  return PendingTensor(&group, work, "all_to_all",
                       [received, wire, c] { return torch::cat(received.unbind(0), c); });
}

void broadcast(torch::Tensor& tensor, const ProcessGroup& group, int root) {
  if (group.trivial()) return;
  torch::Tensor wire = wire_tensor(tensor, group);
  std::vector<torch::Tensor> tensors{wire};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  group.wait(group.backend().broadcast(tensors, options), "broadcast");
  // Accounted as the pipelined ring NCCL uses: the tensor passes once around the ring that starts at the
  // root, so every rank but the last forwards it and every rank but the root receives it.
  const int p = group.size(), last = (root + p - 1) % p;
  group.count(group.rank() == last ? 0 : bytes_of(tensor), group.rank() == root ? 0 : bytes_of(tensor));
  copy_back(tensor, wire);
}

void reduce(torch::Tensor& tensor, const ProcessGroup& group, int root, Reduce op) {
  if (group.trivial()) return;
  torch::Tensor wire = wire_tensor(tensor, group);
  std::vector<torch::Tensor> tensors{wire};
  c10d::ReduceOptions options;
  options.reduceOp = to_c10d(op);
  options.rootRank = root;
  group.wait(group.backend().reduce(tensors, options), "reduce");
  // Accounted as broadcast's ring run backwards: partial sums flow from the rank after the root round to
  // the root, so every rank but the root sends the tensor and every rank but the first receives it.
  const int p = group.size(), first = (root + 1) % p;
  group.count(group.rank() == root ? 0 : bytes_of(tensor), group.rank() == first ? 0 : bytes_of(tensor));
  if (group.rank() != root) return;
  if (op == Reduce::kAvg) wire.div_(group.size());
  copy_back(tensor, wire);
}

void send(const torch::Tensor& tensor, const ProcessGroup& group, int peer, int tag) {
  send_async(tensor, group, peer, tag).wait();
}

void recv(torch::Tensor& tensor, const ProcessGroup& group, int peer, int tag) {
  torch::Tensor wire = wire_tensor(tensor, group);
  std::vector<torch::Tensor> tensors{wire};
  group.wait(group.backend().recv(tensors, peer, tag), "recv");
  group.count(0, bytes_of(tensor));
  copy_back(tensor, wire);
}

PendingTensor recv_async(const torch::Tensor& like, const ProcessGroup& group, int peer, int tag) {
  torch::Tensor tensor = torch::empty_like(like, at::MemoryFormat::Contiguous);
  torch::Tensor wire = wire_tensor(tensor, group);
  std::vector<torch::Tensor> tensors{wire};
  auto work = group.backend().recv(tensors, peer, tag);
  group.count(0, bytes_of(tensor));
  return PendingTensor(&group, work, "recv", [tensor, wire]() mutable {
    copy_back(tensor, wire);
    return tensor;
  });
}

PendingSend send_async(const torch::Tensor& tensor, const ProcessGroup& group, int peer, int tag) {
  torch::Tensor wire = wire_tensor(tensor, group);
  std::vector<torch::Tensor> tensors{wire};
  auto work = group.backend().send(tensors, peer, tag);
  group.count(bytes_of(tensor), 0);
  return PendingSend(&group, std::move(wire), std::move(work));
}

bool PendingSend::completed() const { return !work_ || work_->isCompleted(); }

void PendingSend::wait() {
  if (work_) group_->wait(work_, "send");
  work_.reset();
  wire_ = torch::Tensor();
}

std::vector<PendingSend> exchange(const std::vector<Message>& messages, const ProcessGroup& group) {
  std::vector<PendingSend> sends;
  if (messages.empty()) return sends;
  KUAFU_CHECK(!group.trivial(), "exchange on group '", group.name(), "' of one rank");
  const bool grouped = group.kind() == BackendKind::kNccl;
  std::vector<torch::Tensor> wires;
  std::vector<c10::intrusive_ptr<compat::Work>> receives;
  if (grouped) group.backend().startCoalescing();
  for (const Message& m : messages) {
    wires.push_back(wire_tensor(m.tensor, group));
    std::vector<torch::Tensor> one{wires.back()};
    if (m.send) {
      auto work = group.backend().send(one, m.peer, /*tag=*/0);
      group.count(bytes_of(m.tensor), 0);
      if (!grouped) sends.emplace_back(&group, wires.back(), std::move(work));
    } else {
      auto work = group.backend().recv(one, m.peer, /*tag=*/0);
      group.count(0, bytes_of(m.tensor));
      if (!grouped) receives.push_back(std::move(work));
    }
  }
  if (grouped) receives.push_back(group.backend().endCoalescing());  // the whole group, sends included
  for (const auto& work : receives) group.wait(work, "exchange");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].send && !wires[i].is_same(messages[i].tensor)) messages[i].tensor.copy_(wires[i]);
  }
  return sends;
}

void barrier(const ProcessGroup& group) {
  if (group.trivial()) return;
  group.wait(group.backend().barrier(), "barrier");
}

}  // namespace kuafu::dist

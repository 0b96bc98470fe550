#include "core/parallel/dap/dap.h"

#include <torch/csrc/autograd/custom_function.h>

#include "core/dist/autograd_collectives.h"
#include "core/dist/autograd_group.h"
#include "core/dist/collectives.h"
#include "core/util/error.h"

namespace kuafu::parallel::dap {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

// Gather and move_cut differ only in their collective and its inverse.
struct AsyncState : torch::CustomClassHolder {
  dist::GroupPtr group;
  bool is_gather = true;
  int64_t dim = 0;                  // gather
  int64_t from_dim = 0, to_dim = 0;  // move_cut
  dist::PendingTensor forward;      // started by the call, finished by wait()
  dist::PendingTensor backward;     // started by wait's backward, finished by the call's backward

  dist::PendingTensor start_forward(const torch::Tensor& x) const {
    // Moving the cut: split the whole `to_dim` into blocks, send block j to rank j, join along `from_dim`.
    return is_gather ? dist::all_gather_async(x, *group, dim) : dist::all_to_all_async(x, *group, to_dim, from_dim);
  }
  dist::PendingTensor start_backward(const torch::Tensor& g) const {
    return is_gather ? dist::reduce_scatter_async(g, *group, dim)
                     : dist::all_to_all_async(g, *group, from_dim, to_dim);
  }
};

namespace {

int64_t checked_dim(const torch::Tensor& x, int64_t dim, const dist::ProcessGroup& group, const char* what,
                    bool must_divide) {
  KUAFU_CHECK(dim >= -x.dim() && dim < x.dim(), "dap::", what, ": dim ", dim, " is out of range for a tensor of ",
              x.dim(), " dims");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  KUAFU_CHECK(!must_divide || x.size(d) % group.size() == 0, "dap::", what, ": dim ", d, " has size ", x.size(d),
              ", which does not divide by the DAP group size ", group.size(), "; pad it to a multiple of ",
              group.size());
  return d;
}

c10::intrusive_ptr<AsyncState> state_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<AsyncState>(ctx->saved_data["state"].toCapsule());
}

struct Split : Function<Split> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, dist::GroupPtr group, int64_t dim) {
    const int64_t chunk = x.size(dim) / group->size();
    torch::Tensor block = x.narrow(dim, group->rank() * chunk, chunk).clone();
    ctx->saved_data["dim"] = dim;
    dist::autograd::save_group(ctx, std::move(group));
    return block;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {dist::all_gather(grads[0], dist::autograd::saved_group(ctx), dim), torch::Tensor(), torch::Tensor()};
  }
};

// The first half of an asynchronous primitive: posts the transfer and returns a token; its backward
// waits for the gradient's transfer.
struct Start : Function<Start> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, c10::intrusive_ptr<AsyncState> state) {
    state->forward = state->start_forward(x);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return torch::empty({0}, x.options());
  }
  static variable_list backward(AutogradContext* ctx, variable_list) {
    return {state_of(ctx)->backward.wait(), torch::Tensor()};
  }
};

// The second half: waits for the transfer; its backward posts the gradient's transfer and returns.
struct Wait : Function<Wait> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& token, c10::intrusive_ptr<AsyncState> state) {
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    ctx->saved_data["token_options"] = torch::empty({0}, token.options());
    return state->forward.wait();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = state_of(ctx);
    state->backward = state->start_backward(grads[0].contiguous());
    return {torch::zeros({0}, ctx->saved_data["token_options"].toTensor().options()), torch::Tensor()};
  }
};

Pending start(const torch::Tensor& x, c10::intrusive_ptr<AsyncState> state) {
  torch::Tensor token = Start::apply(x, state);
  return Pending(std::move(token), std::move(state));
}

}  // namespace

torch::Tensor split(const torch::Tensor& x, dist::GroupPtr group, int64_t dim) {
  const int64_t d = checked_dim(x, dim, *group, "split", true);
  return Split::apply(x, std::move(group), d);
}

torch::Tensor local_block(const torch::Tensor& x, const dist::ProcessGroup& group, int64_t dim) {
  const int64_t d = checked_dim(x, dim, group, "local_block", true);
  const int64_t block = x.size(d) / group.size();
  return x.narrow(d, group.rank() * block, block);
}

torch::Tensor gather(const torch::Tensor& x, dist::GroupPtr group, int64_t dim) {
  const int64_t d = checked_dim(x, dim, *group, "gather", false);
  return dist::autograd::all_gather(x, std::move(group), d);
}

torch::Tensor move_cut(const torch::Tensor& x, dist::GroupPtr group, int64_t from_dim, int64_t to_dim) {
  const int64_t from = checked_dim(x, from_dim, *group, "move_cut", false);
  const int64_t to = checked_dim(x, to_dim, *group, "move_cut", true);
  return dist::autograd::all_to_all(x, std::move(group), /*split_dim=*/to, /*concat_dim=*/from);
}

Pending::Pending(torch::Tensor token, c10::intrusive_ptr<AsyncState> state)
    : token_(std::move(token)), state_(std::move(state)) {}
Pending::Pending(Pending&&) noexcept = default;
Pending& Pending::operator=(Pending&&) noexcept = default;
Pending::~Pending() = default;

torch::Tensor Pending::wait() {
  KUAFU_CHECK(state_, "dap::Pending::wait called twice");
  torch::Tensor result = Wait::apply(token_, state_);
  state_.reset();
  token_ = torch::Tensor();
  return result;
}

Pending gather_async(const torch::Tensor& x, dist::GroupPtr group, int64_t dim) {
  auto state = c10::make_intrusive<AsyncState>();
  state->dim = checked_dim(x, dim, *group, "gather_async", false);
  state->group = std::move(group);
  return start(x, state);
}

Pending move_cut_async(const torch::Tensor& x, dist::GroupPtr group, int64_t from_dim, int64_t to_dim) {
  auto state = c10::make_intrusive<AsyncState>();
  state->is_gather = false;
  state->from_dim = checked_dim(x, from_dim, *group, "move_cut_async", false);
  state->to_dim = checked_dim(x, to_dim, *group, "move_cut_async", true);
  state->group = std::move(group);
  return start(x, state);
}

}  // namespace kuafu::parallel::dap

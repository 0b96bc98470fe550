#include "core/dist/autograd_collectives.h"

#include <torch/csrc/autograd/custom_function.h>

#include "core/dist/autograd_group.h"
#include "core/dist/collectives.h"

namespace kuafu::dist::autograd {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

// A group travels through the autograd context in a capsule that owns a reference to it: it lives
// exactly as long as the graph that may run the backward needing it, with no registry of groups.
namespace {
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(GroupPtr group) : group(std::move(group)) {}
  GroupPtr group;
};
}  // namespace

void save_group(AutogradContext* ctx, GroupPtr group) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(std::move(group)));
}
const ProcessGroup& saved_group(AutogradContext* ctx) { return *saved_group_ptr(ctx); }
GroupPtr saved_group_ptr(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule())->group;
}

namespace {

torch::Tensor reduced(torch::Tensor t, const ProcessGroup& group) {
  torch::Tensor out = t.contiguous().clone();
  dist::all_reduce(out, group);
  return out;
}

struct AllReduceSum : Function<AllReduceSum> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, GroupPtr group) {
    torch::Tensor y = reduced(x, *group);
    save_group(ctx, std::move(group));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {reduced(g[0], saved_group(ctx)), torch::Tensor()};
  }
};

struct CopyToGroup : Function<CopyToGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, GroupPtr group) {
    save_group(ctx, std::move(group));
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {reduced(g[0], saved_group(ctx)), torch::Tensor()};
  }
};

struct ReduceFromGroup : Function<ReduceFromGroup> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, GroupPtr group) {
    return reduced(x, *group);
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], torch::Tensor()}; }
};

struct AllGather : Function<AllGather> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, GroupPtr group, int64_t dim) {
    torch::Tensor y = dist::all_gather(x, *group, dim);
    ctx->saved_data["dim"] = dim;
    save_group(ctx, std::move(group));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {dist::reduce_scatter(g[0], saved_group(ctx), dim), torch::Tensor(), torch::Tensor()};
  }
};

struct ReduceScatter : Function<ReduceScatter> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, GroupPtr group, int64_t dim) {
    torch::Tensor y = dist::reduce_scatter(x, *group, dim);
    ctx->saved_data["dim"] = dim;
    save_group(ctx, std::move(group));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {dist::all_gather(g[0], saved_group(ctx), dim), torch::Tensor(), torch::Tensor()};
  }
};

struct AllToAll : Function<AllToAll> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, GroupPtr group,
                               int64_t split_dim, int64_t concat_dim) {
    torch::Tensor y = dist::all_to_all(x, *group, split_dim, concat_dim);
    ctx->saved_data["split"] = split_dim;
    ctx->saved_data["concat"] = concat_dim;
    save_group(ctx, std::move(group));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    // The inverse exchange: split where forward concatenated, concatenate where it split.
    torch::Tensor dx = dist::all_to_all(g[0], saved_group(ctx), ctx->saved_data["concat"].toInt(),
                                        ctx->saved_data["split"].toInt());
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

struct Broadcast : Function<Broadcast> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, GroupPtr group, int64_t root) {
    torch::Tensor y = x.contiguous().clone();
    dist::broadcast(y, *group, static_cast<int>(root));
    ctx->saved_data["root"] = root;
    save_group(ctx, std::move(group));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const ProcessGroup& group = saved_group(ctx);
    torch::Tensor total = reduced(g[0], group);  // only the root's input influenced the outputs
    if (group.rank() != ctx->saved_data["root"].toInt()) total.zero_();
    return {total, torch::Tensor(), torch::Tensor()};
  }
};

struct Send : Function<Send> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, GroupPtr group, int64_t peer) {
    dist::send(x, *group, static_cast<int>(peer));
    ctx->saved_data["peer"] = peer;
    ctx->saved_data["shape"] = x.sizes().vec();
    ctx->saved_data["like"] = torch::empty({0}, x.options());
    save_group(ctx, std::move(group));
    return torch::zeros({}, x.options());
  }
  static variable_list backward(AutogradContext* ctx, variable_list) {
    torch::Tensor like = ctx->saved_data["like"].toTensor();
    torch::Tensor dx = torch::empty(ctx->saved_data["shape"].toIntVector(), like.options());
    dist::recv(dx, saved_group(ctx), static_cast<int>(ctx->saved_data["peer"].toInt()));
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

struct Recv : Function<Recv> {
  // `anchor` is an empty tensor that requires grad, so the engine calls backward.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& anchor, std::vector<int64_t> shape,
                               GroupPtr group, int64_t peer) {
    torch::Tensor y = torch::empty(shape, anchor.options());
    dist::recv(y, *group, static_cast<int>(peer));
    ctx->saved_data["peer"] = peer;
    save_group(ctx, std::move(group));
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    dist::send(g[0].contiguous(), saved_group(ctx), static_cast<int>(ctx->saved_data["peer"].toInt()));
    return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor all_reduce_sum(const torch::Tensor& x, GroupPtr group) { return AllReduceSum::apply(x, std::move(group)); }
torch::Tensor copy_to_group(const torch::Tensor& x, GroupPtr group) { return CopyToGroup::apply(x, std::move(group)); }
torch::Tensor reduce_from_group(const torch::Tensor& x, GroupPtr group) {
  return ReduceFromGroup::apply(x, std::move(group));
}
torch::Tensor all_gather(const torch::Tensor& x, GroupPtr group, int64_t dim) {
  return AllGather::apply(x, std::move(group), dim);
}
torch::Tensor reduce_scatter(const torch::Tensor& x, GroupPtr group, int64_t dim) {
  return ReduceScatter::apply(x, std::move(group), dim);
}
torch::Tensor all_to_all(const torch::Tensor& x, GroupPtr group, int64_t split_dim, int64_t concat_dim) {
  return AllToAll::apply(x, std::move(group), split_dim, concat_dim);
}
torch::Tensor broadcast(const torch::Tensor& x, GroupPtr group, int root) {
  return Broadcast::apply(x, std::move(group), static_cast<int64_t>(root));
}
torch::Tensor send(const torch::Tensor& x, GroupPtr group, int peer) {
  return Send::apply(x, std::move(group), static_cast<int64_t>(peer));
}
torch::Tensor recv(at::IntArrayRef shape, const torch::TensorOptions& options, GroupPtr group, int peer) {
  torch::Tensor anchor = torch::empty({0}, options.requires_grad(true));
  return Recv::apply(anchor, shape.vec(), std::move(group), static_cast<int64_t>(peer));
}

}  // namespace kuafu::dist::autograd

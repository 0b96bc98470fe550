#include "core/parallel/tensor/factory.h"

#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "core/dist/autograd_collectives.h"
#include "core/dist/collectives.h"
#include "core/ops/layer_norm.h"
#include "core/ops/skinny_linear.h"
#include "core/parallel/tensor/layers_3d.h"
#include "core/parallel/tensor/layers_grid.h"
#include "core/parallel/tensor/vocab_parallel.h"
#include "core/util/device.h"
#include "core/util/error.h"
#include "core/util/weight_sink.h"

namespace kuafu::parallel {

dist::GroupPtr TensorParallel::group() const {
  if (!enabled()) return nullptr;
  return mesh->group(axes());
}

int TensorParallel::batch_blocks() const {
  if (!enabled()) return 1;
  const int q = grid_side(spec);
  switch (spec.mode) {
    case TensorMode::k2D: return q;
    case TensorMode::k2p5D: return spec.depth * q;
    case TensorMode::k3D: return q * q;
    default: return 1;
  }
}

SerialLinearImpl::SerialLinearImpl(const LinearSpec& spec, const torch::Device& device) : order_(spec.order) {
  const std::vector<int64_t> shape =
      spec.order == WeightOrder::kInOut ? std::vector<int64_t>{spec.in, spec.out} : std::vector<int64_t>{spec.out, spec.in};
  const auto on = torch::TensorOptions().device(device);
  weight = register_parameter("weight", torch::zeros(shape, on));
  if (spec.bias) bias = register_parameter("bias", torch::zeros({spec.out}, on));
}

torch::Tensor SerialLinearImpl::forward(const torch::Tensor& x) {
  if (order_ == WeightOrder::kOutIn) {
    // A decoding step's few rows: streamed through the weights once instead of through BLAS's packing.
    if (ops::skinny_linear_applies(x, weight, bias)) return ops::skinny_linear(x, weight, bias);
    return torch::nn::functional::linear(x, weight, bias);
  }
  // addmm over the flattened rows: one BLAS call with the bias fused in.
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(1);
  torch::Tensor rows = x.reshape({-1, weight.size(0)});
  return (bias.defined() ? torch::addmm(bias, rows, weight) : torch::mm(rows, weight)).view(sizes);
}

SerialLayerNormImpl::SerialLayerNormImpl(int64_t dim, double eps, const torch::Device& device) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}, torch::TensorOptions().device(device)));
  bias = register_parameter("bias", torch::zeros({dim}, torch::TensorOptions().device(device)));
}

torch::Tensor SerialLayerNormImpl::forward(const torch::Tensor& x) {
  return ops::layer_norm(x, weight, bias, eps_);  // LibTorch's, or Kuafu's kernels on a GPU
}

SerialRmsNormImpl::SerialRmsNormImpl(int64_t dim, double eps, const torch::Device& device, dist::GroupPtr replicas)
    : eps_(eps), replicas_(std::move(replicas)) {
  weight = register_parameter("weight", torch::ones({dim}, torch::TensorOptions().device(device)));
}

torch::Tensor SerialRmsNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor x32 = x.to(torch::kFloat32);
  const torch::Tensor normalized = x32 * torch::rsqrt(x32.square().mean(-1, /*keepdim=*/true) + eps_);
  return (replicas_ ? dist::autograd::copy_to_group(weight, replicas_) : weight) * normalized.to(x.scalar_type());
}

CutRmsNormImpl::CutRmsNormImpl(int64_t hidden, const dist::ProcessMesh& mesh, std::string feature_axis,
                               const std::vector<std::string>& replica_axes, double eps)
    : hidden_(hidden), eps_(eps), feature_axis_(std::move(feature_axis)) {
  features_ = mesh.group(feature_axis_);
  replicas_ = mesh.group(replica_axes);
  const int64_t blocks = features_->size();
  KUAFU_CHECK(hidden % blocks == 0, "RMSNorm's ", hidden, " features do not divide into the ", blocks, " blocks of ", feature_axis_);
  weight = register_parameter("weight", torch::ones({hidden / blocks}, parameter_options(mesh)));
}

torch::Tensor CutRmsNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor x32 = x.to(torch::kFloat32);
  // Σ x² over the whole row's features: each block's share added along the feature axis.
  const torch::Tensor squares = dist::autograd::all_reduce_sum(x32.square().sum(-1, /*keepdim=*/true), features_);
  const torch::Tensor normalized = x32 * torch::rsqrt(squares / static_cast<double>(hidden_) + eps_);
  return dist::autograd::copy_to_group(weight, replicas_) * normalized.to(x.scalar_type());
}

std::map<std::string, Layout> CutRmsNormImpl::parameter_layouts() const { return {{"weight", {{0, {feature_axis_}, 1}}}}; }

namespace {

// Cut layers make their parameters on their mesh's device. A model described on the meta device (lazy
// construction) moves each there as it is made, so building holds at most one layer's block.
void describe_on_meta(const ModelOptions& options, torch::nn::Module& layer) {
  if (!options.device.is_meta()) return;
  for (auto& p : layer.parameters()) rebind(p, torch::empty(p.sizes(), p.options().device(torch::kMeta)));
}
torch::nn::AnyModule placed(const ModelOptions& options, torch::nn::AnyModule layer) {
  describe_on_meta(options, *layer.ptr());
  return layer;
}
template <typename Layer>
std::shared_ptr<Layer> placed(const ModelOptions& options, std::shared_ptr<Layer> layer) {
  describe_on_meta(options, *layer);
  return layer;
}

}  // namespace

torch::nn::AnyModule make_linear(const ModelOptions& options, const LinearSpec& spec, Cut cut) {
  const TensorParallel& tp = options.tp;
  if (!tp.enabled()) return torch::nn::AnyModule(SerialLinear(spec, options.device));
  switch (tp.spec.mode) {
    case TensorMode::k1D:
      if (cut == Cut::kColumn) return placed(options, torch::nn::AnyModule(ColumnParallelLinear(spec, *tp.mesh)));
      return placed(options, torch::nn::AnyModule(RowParallelLinear(spec, *tp.mesh)));
    case TensorMode::k2D:
    case TensorMode::k2p5D:
      return placed(options, torch::nn::AnyModule(GridLinear(spec, *tp.mesh)));
    case TensorMode::k3D:
      return placed(options, torch::nn::AnyModule(Linear3d(spec, *tp.mesh, cut == Cut::kColumn ? Side3d::kY : Side3d::kX)));
    case TensorMode::kNone:
      break;
  }
  fail("make_linear: unknown tensor-parallel mode");
}

torch::nn::AnyModule make_layer_norm(const ModelOptions& options, int64_t dim, double eps) {
  const TensorParallel& tp = options.tp;
  if (!tp.enabled() || tp.spec.mode == TensorMode::k1D) {
    // 1D keeps the residual stream whole on every rank: a replicated LayerNorm.
    return torch::nn::AnyModule(SerialLayerNorm(dim, eps, options.device));
  }
  if (tp.spec.mode == TensorMode::k3D) return placed(options, torch::nn::AnyModule(LayerNorm3d(dim, *tp.mesh, Side3d::kY, eps)));
  return placed(options, torch::nn::AnyModule(GridLayerNorm(dim, *tp.mesh, eps)));
}

torch::nn::AnyModule make_rms_norm(const ModelOptions& options, int64_t dim, double eps) {
  const TensorParallel& tp = options.tp;
  // 1D keeps the residual stream whole on every rank: a replicated RMSNorm.
  if (!tp.enabled() || tp.spec.mode == TensorMode::k1D) return torch::nn::AnyModule(SerialRmsNorm(dim, eps, options.device));
  if (tp.spec.mode == TensorMode::k3D) {
    // The residual stream lies on side kY: features along tp_y, batch rows along tp_x and tp_z.
    return placed(options, torch::nn::AnyModule(CutRmsNorm(dim, *tp.mesh, "tp_y", std::vector<std::string>{"tp_x", "tp_z"}, eps)));
  }
  return placed(options, torch::nn::AnyModule(CutRmsNorm(dim, *tp.mesh, "tp_col", grid_shape(*tp.mesh).row_axes(), eps)));
}

torch::nn::AnyModule make_head_norm(const ModelOptions& options, int64_t head_dim, double eps) {
  const TensorParallel& tp = options.tp;
  return torch::nn::AnyModule(SerialRmsNorm(head_dim, eps, options.device, tp.enabled() ? tp.group() : nullptr));
}

std::shared_ptr<TokenEmbeddingImpl> make_embedding(const ModelOptions& options, int64_t vocab, int64_t dim) {
  const TensorParallel& tp = options.tp;
  if (!tp.enabled()) return std::make_shared<SerialEmbeddingImpl>(vocab, dim, options.device);
  switch (tp.spec.mode) {
    case TensorMode::k1D: return placed(options, std::make_shared<VocabParallelEmbeddingImpl>(vocab, dim, *tp.mesh));
    case TensorMode::k3D: return placed(options, std::make_shared<Embedding3dImpl>(vocab, dim, *tp.mesh));
    default: return placed(options, std::make_shared<GridEmbeddingImpl>(vocab, dim, *tp.mesh));
  }
}

torch::nn::AnyModule make_position_embedding(const ModelOptions& options, int64_t n, int64_t dim) {
  const TensorParallel& tp = options.tp;
  if (!tp.enabled() || tp.spec.mode == TensorMode::k1D) return torch::nn::AnyModule(SerialEmbedding(n, dim, options.device));
  if (tp.spec.mode == TensorMode::k3D) {
    return placed(options, torch::nn::AnyModule(FeatureSplitEmbedding(n, dim, *tp.mesh, "tp_y", std::vector<std::string>{"tp_x", "tp_z"})));
  }
  return placed(options, torch::nn::AnyModule(FeatureSplitEmbedding(n, dim, *tp.mesh, "tp_col", grid_shape(*tp.mesh).row_axes())));
}

namespace {

// Where a column layer's output lives: `classes` holds the other class blocks of this rank's rows,
// `rows` the other row blocks of its classes (null where the mode keeps every row on every rank).
struct ColumnOutput {
  dist::GroupPtr classes, rows;
};

ColumnOutput column_output(const TensorParallel& tp) {
  switch (tp.spec.mode) {
    case TensorMode::k1D: return {tp.group(), nullptr};
    case TensorMode::k3D:  // side kX: classes over tp_x, rows over tp_y and tp_z
      return {tp.mesh->group("tp_x"), tp.mesh->group(std::vector<std::string>{"tp_y", "tp_z"})};
    default: return {tp.mesh->group("tp_col"), tp.mesh->group(grid_shape(*tp.mesh).row_axes())};
  }
}

}  // namespace

torch::Tensor classifier_cross_entropy(const TensorParallel& tp, const torch::Tensor& logits,
                                       const torch::Tensor& targets) {
  if (!tp.enabled()) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  }
  const ColumnOutput cut = column_output(tp);
  if (!cut.rows) {
    return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                                        cut.classes->rank() * logits.size(-1), cut.classes);
  }
  return blocked_cross_entropy(logits, rows_block(targets, *cut.rows), cut.classes, cut.rows);
}

namespace {

// This rank's block of whole logits: its row block (grids) and its slice of the classes.
torch::Tensor classifier_block(const ColumnOutput& cut, const torch::Tensor& whole) {
  const torch::Tensor rows = cut.rows ? rows_block(whole, *cut.rows) : whole;
  const int64_t classes = whole.size(-1) / cut.classes->size();
  return rows.narrow(-1, cut.classes->rank() * classes, classes);
}

// Forward: the whole logits from the blocks. Backward: this rank's block of the whole gradient, since
// every rank computes the same loss from the whole logits (counted once, as in Megatron's gather).
struct GatherClassifierLogits : torch::autograd::Function<GatherClassifierLogits> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits, const TensorParallel* tp) {
    ctx->saved_data["tp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(tp));
    const ColumnOutput cut = column_output(*tp);
    if (!cut.rows) return dist::all_gather(logits.contiguous(), *cut.classes, logits.dim() - 1);
    return gather_blocked_logits(logits, cut.classes, cut.rows);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* tp = reinterpret_cast<const TensorParallel*>(static_cast<intptr_t>(ctx->saved_data["tp"].toInt()));
    return {classifier_block(column_output(*tp), grads[0]).contiguous(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor gather_classifier_logits(const TensorParallel& tp, const torch::Tensor& logits) {
  if (!tp.enabled()) return logits;
  return GatherClassifierLogits::apply(logits, &tp);
}

Layout stream_layout(const TensorParallel& tp, int64_t dims) {
  if (!tp.enabled() || tp.spec.mode == TensorMode::k1D) return {};
  if (tp.spec.mode == TensorMode::k3D) return activation_layout_3d(dims, Side3d::kY);
  return grid_activation_layout(dims, *tp.mesh);
}

torch::Tensor stream_rows(const TensorParallel& tp, const torch::Tensor& rows) {
  Layout batch;
  for (const DimSplit& split : stream_layout(tp, rows.dim())) {
    if (split.dim == 0) batch.push_back(split);
  }
  return batch.empty() ? rows : shard_of(rows, batch, *tp.mesh);
}

std::vector<int64_t> full_shape(at::IntArrayRef local, const Layout& layout, const dist::ProcessMesh& mesh) {
  std::vector<int64_t> shape = local.vec();
  for (const auto& split : layout) {
    int64_t blocks = 1;
    for (const auto& axis : split.axes) blocks *= mesh.size(axis);
    shape[static_cast<size_t>(split.dim)] *= blocks;
  }
  return shape;
}

namespace {

// Forward: this rank's block of a whole activation; backward: the whole gradient from the blocks.
struct EnterStream : torch::autograd::Function<EnterStream> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const TensorParallel* tp) {
    ctx->saved_data["tp"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(tp));
    ctx->saved_data["dims"] = x.dim();
    return shard_of(x, stream_layout(*tp, x.dim()), *tp->mesh).clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* tp = reinterpret_cast<const TensorParallel*>(static_cast<intptr_t>(ctx->saved_data["tp"].toInt()));
    return {gather_full(grads[0].contiguous(), stream_layout(*tp, ctx->saved_data["dims"].toInt()), *tp->mesh),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor enter_stream(const TensorParallel& tp, const torch::Tensor& x) {
  if (stream_layout(tp, x.dim()).empty()) return x;
  return EnterStream::apply(x, &tp);
}

void initialize_like_serial(torch::nn::Module& model, const TensorParallel& tp,
                            const std::function<bool(const std::string& name, torch::Tensor& full)>& init) {
  torch::NoGradGuard no_grad;
  const auto layouts = collect_layouts(model);
  // A parameter still on the meta device is drawn where this rank's are and handed to the weight sink
  // in scope (a sharded strategy laying it into its chunk), or dropped when none wants it (another
  // pipeline stage's), so the generator moves on as in the serial model. With a sink in scope every
  // value is drawn on its device (the run's), also for a parameter held in host memory.
  const WeightSink* sink = current_weight_sink();
  std::optional<torch::Device> drawn_on;
  if (sink) {
    drawn_on = sink->device;
  } else {
    for (const auto& p : model.parameters()) {
      if (!p.is_meta()) drawn_on = p.device();
    }
  }
  for (auto& item : model.named_parameters()) {
    torch::Tensor& p = item.value();
    const auto layout = layouts.find(item.key());
    const bool whole = layout == layouts.end();
    const torch::Device device = (p.is_meta() || sink) && drawn_on ? *drawn_on : p.device();
    if (whole && p.scalar_type() == torch::kFloat32 && !p.is_meta() && p.device() == device) {
      init(item.key(), p);
      continue;
    }
    // Drawn in float32 whatever the parameter is held in (bf16 draws differ), then cut and cast.
    const std::vector<int64_t> shape = whole ? p.sizes().vec() : full_shape(p.sizes(), layout->second, *tp.mesh);
    torch::Tensor full = torch::empty(shape, torch::TensorOptions(torch::kFloat32).device(device));
    const bool drawn = init(item.key(), full);
    if (p.is_meta()) {
      if (!sink || !sink->wants(item.key())) continue;
      if (!drawn) full.zero_();  // kept as made: a lazily made parameter starts at zero
      sink->take(item.key(), whole ? full : shard_of(full, layout->second, *tp.mesh));
    } else if (drawn) {
      p.copy_(whole ? full : shard_of(full, layout->second, *tp.mesh));
    }
  }
}

}  // namespace kuafu::parallel

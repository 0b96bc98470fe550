#include "core/ops/linear_cross_entropy.h"

#include "core/ops/cross_entropy_rows_cpu.h"
#include "core/util/error.h"

#ifdef KUAFU_WITH_CUDA
#include "core/ops/cross_entropy_rows_cuda.h"
#include "core/ops/cuda_tensors.h"
#endif

namespace kuafu::ops {

namespace {

torch::ScalarType compute_type(const torch::Tensor& hidden) {
  return at::promote_types(hidden.scalar_type(), torch::kFloat32);
}

// One chunk's rows: the logits z [n, Vp] (the first V columns real) and their targets.
struct ChunkRows {
  torch::Tensor logits;   // [n, Vp], overwritten by the gradient of the loss sum when asked
  torch::Tensor targets;  // [n]
  torch::Tensor scale;    // [n], the compute type: 1 / learned count where learned, else 0
  int64_t vocab;          // V
};

// The row pass with ATen operations (float64, and anything the kernels do not take).
torch::Tensor rows_with_aten(const ChunkRows& c, int64_t ignored, bool write_gradient) {
  const torch::Tensor valid = c.logits.narrow(1, 0, c.vocab);
  const auto type = c.scale.scalar_type();
  const bool copied = valid.scalar_type() != type;
  torch::Tensor x = copied ? valid.to(type) : valid;  // [n, V]
  const torch::Tensor lse = x.logsumexp(1);           // [n]
  const torch::Tensor learned = c.targets.ne(ignored);
  const torch::Tensor safe_targets = c.targets.masked_fill(learned.logical_not(), 0).unsqueeze(1);
  const torch::Tensor picked = x.gather(1, safe_targets).squeeze(1);
  const torch::Tensor loss = (lse - picked).masked_fill(learned.logical_not(), 0.0);
  if (write_gradient) {
    x.sub_(lse.unsqueeze(1)).exp_().mul_(c.scale.unsqueeze(1));  // softmax, scaled per row
    x.scatter_add_(1, safe_targets, c.scale.neg().unsqueeze(1));   // minus the one-hot (0 on ignored rows)
    if (copied) valid.copy_(x);
    if (c.logits.size(1) > c.vocab) c.logits.narrow(1, c.vocab, c.logits.size(1) - c.vocab).zero_();
  }
  return loss;
}

#ifdef KUAFU_WITH_CUDA
bool kernel_takes(const ChunkRows& c) {
  const torch::Tensor& z = c.logits;
  if (!z.is_cuda() || !z.is_contiguous() || c.scale.scalar_type() != torch::kFloat32) return false;
  if (!cuda::has_row_type(z.scalar_type())) return false;
  const int64_t row_bytes = z.size(1) * static_cast<int64_t>(z.element_size());
  return row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(z.data_ptr()) % 16 == 0;
}

torch::Tensor rows_with_kernel(const ChunkRows& c, int64_t ignored, bool write_gradient) {
  const torch::Tensor& z = c.logits;
  const torch::Tensor targets = c.targets.to(torch::kInt64).contiguous();
  const torch::Tensor scale = c.scale.contiguous();
  torch::Tensor loss = torch::empty({z.size(0)}, z.options().dtype(torch::kFloat32));
  KUAFU_CHECK(cuda::cross_entropy_rows(z.data_ptr(), cuda::row_type(z), z.size(0), z.size(1), c.vocab,
                                       targets.data_ptr<int64_t>(), ignored, scale.data_ptr<float>(),
                                       loss.data_ptr<float>(), write_gradient, cuda::stream_of(z)),
              "the fused cross-entropy kernel failed to launch on ", z.device());
  return loss;
}
#endif

bool cpu_kernel_takes(const ChunkRows& c) {
  const auto type = c.logits.scalar_type();
  return c.logits.device().is_cpu() && (type == torch::kFloat32 || type == torch::kBFloat16) && c.logits.is_contiguous() &&
         c.scale.scalar_type() == torch::kFloat32;
}

torch::Tensor rows_with_cpu_kernel(const ChunkRows& c, int64_t ignored, bool write_gradient) {
  torch::Tensor z = c.logits;  // [n, Vp] float32 or bfloat16, overwritten by its gradient when asked
  const torch::Tensor targets = c.targets.to(torch::kInt64).contiguous();
  const torch::Tensor scale = c.scale.contiguous();
  torch::Tensor loss = torch::empty({z.size(0)}, z.options().dtype(torch::kFloat32));  // [n]
  if (z.scalar_type() == torch::kBFloat16) {
    cpu::cross_entropy_rows_bf16(reinterpret_cast<uint16_t*>(z.data_ptr<at::BFloat16>()), z.size(0), z.size(1), c.vocab,
                                 targets.data_ptr<int64_t>(), ignored, scale.data_ptr<float>(), loss.data_ptr<float>(),
                                 write_gradient);
  } else {
    cpu::cross_entropy_rows(z.data_ptr<float>(), z.size(0), z.size(1), c.vocab, targets.data_ptr<int64_t>(), ignored,
                            scale.data_ptr<float>(), loss.data_ptr<float>(), write_gradient);
  }
  return loss;
}

torch::Tensor row_pass(const ChunkRows& c, int64_t ignored, bool write_gradient) {
#ifdef KUAFU_WITH_CUDA
  if (kernel_takes(c)) return rows_with_kernel(c, ignored, write_gradient);
#endif
  if (cpu_kernel_takes(c)) return rows_with_cpu_kernel(c, ignored, write_gradient);
  return rows_with_aten(c, ignored, write_gradient);
}

int64_t default_chunk_bytes(const torch::Device& device) {
  // Each chunk after the first adds its product to W's gradient (a pass over [V, C] in float32): a GPU
  // does that at little cost, and its products stay efficient with thousands of rows; on the CPU fewer,
  // larger chunks were faster (GPT-2 124M, 1 x 1024 tokens: 32 MB chunks 3% slower than unfused).
  return device.is_cuda() ? (int64_t{1} << 30) : (int64_t{256} << 20);
}

struct FusedResult {
  torch::Tensor loss;         // [] compute type
  torch::Tensor grad_hidden;  // [N, C] hidden's type, for a loss gradient of 1 (undefined: not asked)
  torch::Tensor grad_weight;  // [V, C] likewise: the logits' type from one chunk, else the compute type
};

// Which gradients the pass forms during the forward.
struct Wanted {
  bool hidden = false;
  bool weight = false;
  bool any() const { return hidden || weight; }
};

FusedResult fused_pass(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                       int64_t ignored, const LinearCrossEntropyOptions& options, Wanted wanted) {
  const int64_t n = hidden.size(0), c = hidden.size(1), vocab = weight.size(0);
  const auto type = compute_type(hidden);
  const int64_t multiple =
      options.vocab_multiple > 0 ? options.vocab_multiple : (hidden.is_cuda() ? int64_t{64} : int64_t{1});
  const int64_t padded = (vocab + multiple - 1) / multiple * multiple;
  // [Vp, C]: zero rows past V, whose logits the row pass leaves out and whose gradient it zeroes.
  const torch::Tensor w = padded == vocab ? weight : torch::cat({weight, weight.new_zeros({padded - vocab, c})});
  const int64_t chunk_bytes = options.chunk_bytes > 0 ? options.chunk_bytes : default_chunk_bytes(hidden.device());
  const int64_t rows_per_chunk = std::max<int64_t>(1, chunk_bytes / (padded * 4));

  const torch::Tensor learned = targets.ne(ignored);
  const torch::Tensor count = learned.sum().clamp_min(1).to(type);
  const torch::Tensor scale = learned.to(type) / count;  // [N]
  torch::Tensor loss_sum = torch::zeros({}, hidden.options().dtype(type));
  FusedResult out;
  torch::Tensor grad_w;  // [Vp, C]
  if (wanted.hidden) out.grad_hidden = torch::empty_like(hidden);
  for (int64_t start = 0; start < n; start += rows_per_chunk) {
    const int64_t rows = std::min(rows_per_chunk, n - start);
    const torch::Tensor h = hidden.narrow(0, start, rows);  // [n, C]
    ChunkRows chunk{torch::mm(h, w.t()), targets.narrow(0, start, rows), scale.narrow(0, start, rows), vocab};
    loss_sum.add_(row_pass(chunk, ignored, wanted.any()).to(type).sum());
    const torch::Tensor& d = chunk.logits;  // [n, Vp], now the gradient of the mean loss by the logits
    if (wanted.hidden) {
      torch::Tensor rows_out = out.grad_hidden.narrow(0, start, rows);
      torch::mm_out(rows_out, d, w);
    }
    if (!wanted.weight) continue;
    if (!grad_w.defined()) {
      // One chunk's product stays in its own type (bfloat16: the weight's, which backward hands on as it is);
      // several are summed in the compute type.
      grad_w = rows_per_chunk >= n ? torch::mm(d.t(), h) : torch::mm(d.t(), h).to(type);
    } else if (d.scalar_type() == type) {
      grad_w.addmm_(d.t(), h);
    } else {
      grad_w.add_(torch::mm(d.t(), h));  // reduced precision: each chunk's product summed in float32
    }
  }
  out.loss = loss_sum / count;
  if (wanted.weight && !grad_w.defined()) grad_w = torch::zeros({padded, c}, weight.options().dtype(type));  // no rows
  // Not a view where nothing was padded: autograd adds a tied weight's other gradient in place only into a tensor
  // that owns its memory alone.
  if (wanted.weight) out.grad_weight = padded == vocab ? grad_w : grad_w.narrow(0, 0, vocab);
  return out;
}

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets, int64_t ignored,
                               int64_t chunk_bytes, int64_t vocab_multiple) {
    const Wanted wanted{hidden.requires_grad(), weight.requires_grad()};
    FusedResult r = fused_pass(hidden, weight, targets, ignored, {chunk_bytes, vocab_multiple}, wanted);
    ctx->saved_data["grad_hidden"] = r.grad_hidden;
    ctx->saved_data["grad_weight"] = r.grad_weight;
    ctx->saved_data["weight_type"] = static_cast<int64_t>(weight.scalar_type());
    return r.loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::Tensor& g = grad_outputs[0];  // [] the loss's gradient (1, a micro-batch share, a loss scale)
    // Taken out of the context, so each gradient leaves here as the only reference to its memory: autograd then
    // adds a tied weight's other gradient into it in place instead of into a new [V, C] tensor (GPT-2 124M on the
    // CPU: that add took 250 ms a step, most of it faulting in fresh pages).
    const torch::Tensor grad_hidden = ctx->saved_data["grad_hidden"].toTensor();
    const torch::Tensor grad_weight = ctx->saved_data["grad_weight"].toTensor();
    const auto weight_type = static_cast<torch::ScalarType>(ctx->saved_data["weight_type"].toInt());
    ctx->saved_data.clear();
    // On the CPU reading the scale costs nothing, and a gradient of 1 (the usual one) needs no pass.
    if (!g.is_cuda() && g.item<double>() == 1.0) {
      return {grad_hidden, grad_weight.defined() ? grad_weight.to(weight_type) : torch::Tensor(), {}, {}, {}, {}};
    }
    return {grad_hidden.defined() ? grad_hidden * g.to(grad_hidden.scalar_type()) : torch::Tensor(),
            grad_weight.defined() ? (grad_weight * g).to(weight_type) : torch::Tensor(), {}, {}, {}, {}};
  }
};

}  // namespace

torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t ignored) {
  namespace F = torch::nn::functional;
  const torch::Tensor sum =
      F::cross_entropy(logits, targets, F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(ignored));
  return sum / targets.ne(ignored).sum().clamp_min(1).to(sum.scalar_type());
}

torch::Tensor plain_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                         const torch::Tensor& targets, int64_t ignored) {
  return mean_cross_entropy(torch::matmul(hidden, weight.t()).to(compute_type(hidden)), targets, ignored);
}

torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                                   int64_t ignored, const LinearCrossEntropyOptions& options) {
  KUAFU_CHECK(hidden.dim() == 2 && weight.dim() == 2 && targets.dim() == 1 && hidden.size(0) == targets.size(0) &&
                  hidden.size(1) == weight.size(1),
              "linear_cross_entropy takes hidden [N, C], weight [V, C] and targets [N], got ", hidden.sizes(), ", ",
              weight.sizes(), " and ", targets.sizes());
  const bool want_gradients = torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  if (want_gradients && hidden.scalar_type() == torch::kHalf) {
    return plain_linear_cross_entropy(hidden, weight, targets, ignored);
  }
  const torch::Tensor rows = hidden.contiguous();
  if (!want_gradients) return fused_pass(rows, weight, targets, ignored, options, Wanted{}).loss;
  return LinearCrossEntropyFunction::apply(rows, weight, targets, ignored, options.chunk_bytes, options.vocab_multiple);
}

}  // namespace kuafu::ops

#include "core/ops/attention.h"

#include <cmath>
#include <limits>

#include "core/ops/attention_kernels.h"
#include "core/util/error.h"

namespace kuafu::ops {

namespace {

// LibTorch 2.11's fused CPU kernel (flash attention) is the faster one in fp32, but in bf16 only from
// about 512 keys: forward + backward on this machine, fused vs plain products, fp32 [128, 4, 50, 16]
// 14.4 vs 17.8 ms and causal [16, 4, 128, 64] 12.8 vs 16.6 ms; bf16 45.9 vs 5.7 ms and 19.5 vs 7.3 ms,
// causal [4, 12, T, 64] at T = 256, 512, 1024: 31.5 vs 25.3, 89.0 vs 94.5, 207 vs 481 ms. GPUs always
// take the fused kernels.
bool fused_kernel_is_faster(const torch::Tensor& q, int64_t keys) {
  constexpr int64_t kFusedFromKeys = 512;
  return q.is_cuda() || !at::isReducedFloatingType(q.scalar_type()) || keys >= kFusedFromKeys;
}

// at::scaled_dot_product_attention, noting its kernel for a benchmark. Where the kernel runtime.attention_backend
// named does not take the inputs, LibTorch's message says only that no kernel was found: this one names the key.
torch::Tensor libtorch_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& mask, double dropout, bool causal) {
  if (recording_attention_kernels()) note_attention_kernel(libtorch_attention_kernel(q, k, v, mask, dropout, causal));
  try {
    return at::scaled_dot_product_attention(q, k, v, mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt,
                                            dropout, causal);
  } catch (const c10::Error&) {
    const std::string& chosen = chosen_attention_backend();
    if (chosen == "auto" || libtorch_attention_kernel(q, k, v, mask, dropout, causal) != "none") throw;
    fail(detail::concat("runtime.attention_backend = \"", chosen, "\": that kernel does not take this attention (",
                        q.scalar_type(), " on ", q.device(), ", queries ", q.sizes(), ", keys ", k.sizes(),
                        mask.defined() ? ", a mask" : "", causal ? ", causal" : "", dropout > 0 ? ", dropout" : "",
                        "); \"auto\" lets LibTorch choose"));
  }
}

}  // namespace

torch::Tensor scaled_dot_product_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                           bool causal, double dropout, const AttentionMask& mask) {
  const int64_t tq = q.size(2);
  const int64_t tk = k.size(2);
  const torch::Tensor& key_padding = mask.key_padding;
  if (mask.documents.defined()) {
    TORCH_CHECK(tq == tk && !key_padding.defined() && mask.documents.sizes() == at::IntArrayRef({q.size(0), tq}),
                "attention within documents takes whole packed rows: documents [B, T], no cache, no padding mask");
    // Query i sees key j of the same document (and j <= i when causal). Every query sees itself.
    const torch::Tensor& d = mask.documents;
    torch::Tensor allowed = d.unsqueeze(2).eq(d.unsqueeze(1));  // [B, T, T]
    if (causal) allowed = allowed.logical_and(torch::ones({tq, tk}, allowed.options()).tril());
    if (mask.window > 0) allowed = allowed.logical_and(torch::ones({tq, tk}, allowed.options()).triu(1 - mask.window));
    return libtorch_attention(q, k, v, allowed.unsqueeze(1), dropout, /*causal=*/false);
  }
  // tq != tk: decoding with a cache
  const bool masked = (causal && tq != tk) || key_padding.defined() || mask.window > 0;
  // A kernel named in the config runs wherever LibTorch's take the mask; "auto" keeps the faster of the two.
  if (!masked && (chosen_attention_backend() != "auto" || fused_kernel_is_faster(q, tk))) {
    return libtorch_attention(q, k, v, /*mask=*/{}, dropout, causal);
  }
  if (recording_attention_kernels()) note_attention_kernel("products");
  // Scores and softmax in float32 under reduced precision, as the fused kernels compute them (and diffusers'
  // upcast_attention): bf16 scores of size 30 are off by up to 0.06, each probability by up to 6%, and
  // fp16 scores past 65,504 overflow to inf and NaN.
  const bool upcast = at::isReducedFloatingType(q.scalar_type());
  torch::Tensor scores = torch::matmul(upcast ? q.to(torch::kFloat32) : q, (upcast ? k.to(torch::kFloat32) : k).transpose(-2, -1)) /
                         std::sqrt(static_cast<double>(q.size(-1)));  // [B, H, Tq, Tk]
  if (causal || mask.window > 0) {
    // Key j is hidden from query i (position tk - tq + i) when it comes later, or `window` or more before.
    const auto positions = torch::TensorOptions().dtype(torch::kInt64).device(q.device());
    const torch::Tensor rows = torch::arange(tk - tq, tk, positions).unsqueeze(1);  // [Tq, 1]
    const torch::Tensor cols = torch::arange(tk, positions).unsqueeze(0);           // [1, Tk]
    torch::Tensor hidden = causal ? cols > rows : torch::zeros({tq, tk}, positions.dtype(torch::kBool));
    if (mask.window > 0) hidden = hidden.logical_or(cols <= rows - mask.window);
    scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  }
  if (key_padding.defined()) {
    // The lowest finite score rather than -inf (as Hugging Face does): a query with every key hidden
    // then averages the values instead of dividing 0 by 0.
    scores = scores.masked_fill(key_padding.logical_not().view({key_padding.size(0), 1, 1, tk}), std::numeric_limits<float>::lowest());
  }
  return torch::matmul(torch::dropout(torch::softmax(scores, -1), dropout, dropout > 0).to(v.scalar_type()), v);
}

void KVCache::reserve(int64_t capacity) {
  KUAFU_CHECK(keys.defined(), "a key-value cache is reserved after its first append (it learns its shapes there)");
  KUAFU_CHECK(capacity >= length(), "a key-value cache of ", length(), " tokens cannot shrink to ", capacity, " slots");
  const int64_t filled = length();
  auto buffer = [&](const torch::Tensor& cached) {
    torch::Tensor b = torch::empty({cached.size(0), cached.size(1), capacity, cached.size(3)}, cached.options());  // [B, H, C, D]
    b.narrow(2, 0, filled).copy_(cached.narrow(2, 0, filled));
    b.narrow(2, filled, capacity - filled).zero_();  // fixed-shape attention reads every slot (masked, but never NaN)
    return b;
  };
  key_buffer_ = buffer(keys), value_buffer_ = buffer(values);
  capacity_ = capacity, filled_ = filled;
  keys = key_buffer_.narrow(2, 0, filled), values = value_buffer_.narrow(2, 0, filled);
}

void KVCache::fix_shape(torch::Tensor slot) {
  KUAFU_CHECK(capacity_ > 0, "a key-value cache takes a fixed shape once reserved");
  slot_ = std::move(slot);
  keys = key_buffer_, values = value_buffer_;
}

std::pair<torch::Tensor, torch::Tensor> KVCache::append(const torch::Tensor& k, const torch::Tensor& v) {
  if (capacity_ == 0) {
    keys = keys.defined() ? torch::cat({keys, k}, 2) : k;
    values = values.defined() ? torch::cat({values, v}, 2) : v;
    return {keys, values};
  }
  const int64_t t = k.size(2);
  if (fixed_shape()) {
    KUAFU_CHECK(t == 1, "a fixed-shape key-value cache appends one token a step, not ", t);
    key_buffer_.index_copy_(2, slot_, k);
    value_buffer_.index_copy_(2, slot_, v);
  } else {
    KUAFU_CHECK(filled_ + t <= capacity_, "a key-value cache of ", capacity_, " slots holds ", filled_, " tokens and cannot take ", t,
                " more");
    key_buffer_.narrow(2, filled_, t).copy_(k);
    value_buffer_.narrow(2, filled_, t).copy_(v);
    keys = key_buffer_.narrow(2, 0, filled_ + t), values = value_buffer_.narrow(2, 0, filled_ + t);
  }
  filled_ += t;
  return {keys, values};
}

}  // namespace kuafu::ops

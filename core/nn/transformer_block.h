// The transformer block, written once and configured per model: pre- or post-norm, LayerNorm or RMSNorm,
// a fused or separate q/k/v projection, grouped-query attention with its own head width, rotary
// positions, q/k norms and a sliding window, a plain or gated MLP and its activation, causal or not, and
// the Hugging Face names of its parts, so GPT-2, ViT, OPT, CLIP's text encoder and the Llama family
// (Llama, Qwen2/3, Mistral) are configurations of it rather than copies. Every linear
// layer and norm comes from the tensor-parallel factories; attention runs in AttentionCore, where
// sequence parallelism is switched on from outside.
#pragma once

#include <optional>
#include <string>

#include "core/nn/rotary.h"
#include "core/ops/attention.h"
#include "core/parallel/sequence/sequence_parallel.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::nn {

enum class Activation {
  kGelu,      // exact (erf)
  kGeluTanh,  // GPT-2's "gelu_new"
  kQuickGelu, // CLIP: x sigmoid(1.702 x)
  kRelu,      // OPT
  kSilu,      // x sigmoid(x): the Llama family's gated MLP (SwiGLU)
};
torch::Tensor activate(Activation activation, const torch::Tensor& x);

// softmax(q kᵀ/√D + masks) v over this rank's heads, with no parameters of its own: heads split and
// merged, keys and values cached for decoding (grouped-query attention caches only the key-value heads),
// causal, padding and sliding-window masks, dropout on the probabilities while training. `sequence` (set
// by parallelize, off by default) makes the positions of q, k, v this rank's chunk of the sequence.
struct AttentionCoreImpl : torch::nn::Module {
  AttentionCoreImpl(int64_t heads, bool causal, double dropout, int64_t kv_heads = 0, int64_t window = 0)
      : heads(heads), kv_heads(kv_heads > 0 ? kv_heads : heads), causal(causal), dropout(dropout), window(window) {}
  // q [B, T, h D], k and v [B, T, h_kv D] -> [B, T, h D]; mask.key_padding [B, Tk] counts the cached keys too.
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, ops::KVCache* cache = nullptr,
                        const ops::AttentionMask& mask = {});
  int64_t heads;     // query heads on this rank
  int64_t kv_heads;  // key-value heads on this rank, each shared by heads / kv_heads query heads in turn
  bool causal;
  double dropout;
  int64_t window;  // sliding window (0: none)
  parallel::sequence::SequenceParallel sequence;
};
TORCH_MODULE(AttentionCore);

// Paths of the block's layers as the model's checkpoints name them (a dot makes a container module).
struct BlockNames {
  std::string norm_1, norm_2;  // before attention and before the MLP (after them when post-norm)
  std::string qkv;             // a fused q|k|v projection (GPT-2's c_attn); empty: q, k and v apart
  std::string q, k, v;
  std::string q_norm, k_norm;  // with qk_norm
  std::string attention_out;
  std::string fc_in, fc_out;
  std::string fc_gate;  // with gated_mlp: the projection the activation runs on (Llama's gate_proj)
};

struct TransformerBlockSpec {
  int64_t hidden = 0, heads = 0, intermediate = 0;
  Activation activation = Activation::kGelu;
  bool pre_norm = true;  // x + f(norm(x)); false: norm(x + f(x)) (BERT, OPT-350m)
  bool causal = false;
  double dropout = 0;            // after each branch's output projection
  double attention_dropout = 0;  // on the attention probabilities
  double norm_eps = 1e-5;
  parallel::WeightOrder weight_order = parallel::WeightOrder::kOutIn;  // GPT-2's Conv1D is kInOut
  BlockNames names;
  // The Llama family's options (the defaults are GPT-2's, OPT's and ViT's block):
  bool rms_norm = false;  // RMSNorm instead of LayerNorm
  int64_t kv_heads = 0;   // grouped-query attention's key-value heads (0: one per query head)
  int64_t head_dim = 0;   // each head's width (0: hidden / heads)
  bool qkv_bias = true, out_bias = true, mlp_bias = true;
  bool gated_mlp = false;  // fc_out(act(fc_gate(x)) * fc_in(x))
  bool qk_norm = false;    // RMSNorm over each head's queries and keys before the rotation (Qwen3)
  std::optional<RotarySpec> rotary;  // queries and keys rotated by position
  int64_t window = 0;                // sliding-window attention (0: none)

  int64_t head_width() const { return head_dim > 0 ? head_dim : hidden / heads; }
  int64_t key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
};

// Attention then MLP, each a residual branch. The first projection of each branch is a column layer
// (every rank holds whole heads), the second a row layer, so attention itself runs locally on a rank's
// heads in every tensor-parallel mode.
struct TransformerBlockImpl : torch::nn::Module {
  TransformerBlockImpl(const TransformerBlockSpec& spec, const parallel::ModelOptions& options);
  // x [B, T, C] (the stream in the tensor mode's layout); `cache` continues a decoded sequence.
  torch::Tensor forward(const torch::Tensor& x, ops::KVCache* cache = nullptr, const ops::AttentionMask& mask = {});

  TransformerBlockSpec spec;
  torch::nn::AnyModule norm_1, norm_2, qkv, q, k, v, q_norm, k_norm, attention_out, fc_in, fc_out, fc_gate;
  AttentionCore attention{nullptr};
  torch::nn::Dropout dropout{nullptr};

 private:
  torch::Tensor attend(const torch::Tensor& x, ops::KVCache* cache, const ops::AttentionMask& mask);
  // Queries or keys [B, T, h D] normalised per head (`norm`, when set) and rotated by position (with rotary).
  torch::Tensor place_heads(const torch::Tensor& x, torch::nn::AnyModule& norm, const std::pair<torch::Tensor, torch::Tensor>& angles);
  // cos and sin of the queries' positions (mask.positions, else the cached count onwards).
  std::pair<torch::Tensor, torch::Tensor> angles_of(const torch::Tensor& x, const ops::KVCache* cache, const ops::AttentionMask& mask);
  // Registers `layer` at `path` under this block, making the containers a dotted path names.
  void register_at(const std::string& path, const std::shared_ptr<torch::nn::Module>& layer);
};
TORCH_MODULE(TransformerBlock);

}  // namespace kuafu::nn

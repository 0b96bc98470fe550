// The transformer block, written once and configured per model: pre- or post-norm, a fused or separate
// q/k/v projection, the MLP's activation, causal or not, and the Hugging Face names of its parts, so
// GPT-2, ViT, OPT and CLIP's text encoder are configurations of it rather than copies. Every linear
// layer and norm comes from the tensor-parallel factories; attention runs in AttentionCore, where
// sequence parallelism is switched on from outside.
#pragma once

#include <string>

#include "core/ops/attention.h"
#include "core/parallel/sequence/sequence_parallel.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::nn {

enum class Activation {
  kGelu,      // exact (erf)
  kGeluTanh,  // GPT-2's "gelu_new"
  kQuickGelu, // CLIP: x sigmoid(1.702 x)
  kRelu,      // OPT
};
torch::Tensor activate(Activation activation, const torch::Tensor& x);

// softmax(q kᵀ/√D + masks) v over this rank's heads, with no parameters of its own: heads split and
// merged, keys and values cached for decoding, causal and padding masks, dropout on the probabilities
// while training. `sequence` (set by parallelize, off by default) makes the positions of q, k, v this
// rank's chunk of the sequence.
struct AttentionCoreImpl : torch::nn::Module {
  AttentionCoreImpl(int64_t heads, bool causal, double dropout) : heads(heads), causal(causal), dropout(dropout) {}
  // q, k, v [B, T, h D] -> [B, T, h D]; mask.key_padding [B, Tk] counts the cached keys too.
  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, ops::KVCache* cache = nullptr,
                        const ops::AttentionMask& mask = {});
  int64_t heads;  // on this rank
  bool causal;
  double dropout;
  parallel::sequence::SequenceParallel sequence;
};
TORCH_MODULE(AttentionCore);

// Paths of the block's layers as the model's checkpoints name them (a dot makes a container module).
struct BlockNames {
  std::string norm_1, norm_2;  // before attention and before the MLP (after them when post-norm)
  std::string qkv;             // a fused q|k|v projection (GPT-2's c_attn); empty: q, k and v apart
  std::string q, k, v;
  std::string attention_out;
  std::string fc_in, fc_out;
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
};

// Attention then MLP, each a residual branch. The first projection of each branch is a column layer
// (every rank holds whole heads), the second a row layer, so attention itself runs locally on a rank's
// heads in every tensor-parallel mode.
struct TransformerBlockImpl : torch::nn::Module {
  TransformerBlockImpl(const TransformerBlockSpec& spec, const parallel::ModelOptions& options);
  // x [B, T, C] (the stream in the tensor mode's layout); `cache` continues a decoded sequence.
  torch::Tensor forward(const torch::Tensor& x, ops::KVCache* cache = nullptr, const ops::AttentionMask& mask = {});

  TransformerBlockSpec spec;
  torch::nn::AnyModule norm_1, norm_2, qkv, q, k, v, attention_out, fc_in, fc_out;
  AttentionCore attention{nullptr};
  torch::nn::Dropout dropout{nullptr};

 private:
  torch::Tensor attend(const torch::Tensor& x, ops::KVCache* cache, const ops::AttentionMask& mask);
  // Registers `layer` at `path` under this block, making the containers a dotted path names.
  void register_at(const std::string& path, const std::shared_ptr<torch::nn::Module>& layer);
};
TORCH_MODULE(TransformerBlock);

}  // namespace kuafu::nn

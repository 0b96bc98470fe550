// GPT-2 with Hugging Face's parameter names and shapes (transformer.h.0.attn.c_attn.weight is
// [C, 3C], Conv1D layout), tied input/output embeddings, GPT-2 initialisation and a KV cache.
#pragma once

#include <optional>
#include <vector>

#include "core/nn/attention.h"
#include "core/nn/block_hooks.h"
#include "core/parallel/pipeline/schedule.h"
#include "core/parallel/sequence/sequence_parallel.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::gpt {

struct GPTConfig {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double dropout = 0.0;  // embeddings, attention probabilities and residual branches
  double layer_norm_epsilon = 1e-5;

  int64_t parameter_count() const;  // with the output embedding tied to the input one
  // Forward + backward FLOPs per token at sequence length t: 6N + 12·L·C·t (the attention matmuls).
  double flops_per_token(int64_t t) const;
};

// Every layer comes from the parallel:: factories, so one model serves every tensor-parallel mode.
// Linear layers keep GPT-2's Conv1D storage ([in, out]); c_attn is cut per q|k|v segment, so each rank
// owns whole heads and attention itself runs locally on them, in any mode.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const GPTConfig& config, const parallel::TensorParallel& tp);
  torch::Tensor forward(const torch::Tensor& x, nn::KVCache* cache);  // x [B, T, C]
  torch::nn::AnyModule c_attn, c_proj;
  int64_t n_head;  // heads on this rank
  double dropout;
  parallel::sequence::SequenceParallel sequence;  // on: x holds this rank's chunk of the positions
  torch::nn::Dropout resid_dropout{nullptr};
};
TORCH_MODULE(Attention);

struct MLPImpl : torch::nn::Module {
  MLPImpl(const GPTConfig& config, const parallel::TensorParallel& tp);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::AnyModule c_fc, c_proj;
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(MLP);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const GPTConfig& config, const parallel::TensorParallel& tp);
  torch::Tensor forward(const torch::Tensor& x, nn::KVCache* cache);
  torch::nn::AnyModule ln_1, ln_2;
  Attention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

struct TransformerImpl : torch::nn::Module {
  TransformerImpl(const GPTConfig& config, const parallel::TensorParallel& tp);
  std::shared_ptr<parallel::TokenEmbeddingImpl> wte;  // [V, C], also the output layer (this rank's block)
  torch::nn::AnyModule wpe;                           // [n_positions, C] (features cut like the stream's)
  torch::nn::Dropout drop{nullptr};
  std::shared_ptr<torch::nn::Module> h;  // children "0" .. "L-1": the blocks this rank holds
  std::vector<Block> blocks;             // by layer; null where another pipeline stage holds the block
  torch::nn::AnyModule ln_f;
};
TORCH_MODULE(Transformer);

// The parts of the model one pipeline rank holds: the layer ranges [begin, end) of its chunks (one
// per virtual stage, in chunk order), whether it runs the first virtual stage (token and position
// embeddings) and the last (final LayerNorm, tied output layer, loss; it keeps its own copy of the
// token embedding, whose gradient is summed with the first stage's).
struct StagePlan {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  bool first = true;
  bool last = true;
  static StagePlan whole(int64_t layers) { return {{{0, layers}}, true, true}; }
};

// What each part of the model costs, for balancing the pipeline stages: one layer, and what the first
// stage (embeddings) and the last (final norm, tied output layer and loss) carry besides their layers.
struct StageCosts {
  double layer = 1, first = 0, last = 0;
};
// In parameters: the first and last stage each hold the token embedding, the first the positions too.
StageCosts parameter_costs(const GPTConfig& config);
// In seconds, timed forward + backward on this process (median of 3 after a warm-up) for micro-batches
// of rows x context tokens; the output layer's share grows with the vocabulary.
StageCosts measured_costs(const GPTConfig& config, int64_t rows, int64_t context, const torch::Device& device = torch::kCPU);

// Pipeline stage `stage`'s plan: the layers cut into the schedule's p v virtual stages, chunk c
// holding virtual stage c p + stage; equal layer counts, or balanced by `costs`.
StagePlan pipeline_stage_plan(const parallel::pipeline::ScheduleSpec& spec, int stage, int64_t layers);
StagePlan pipeline_stage_plan(const parallel::pipeline::ScheduleSpec& spec, int stage, int64_t layers,
                              const StageCosts& costs);

struct GPTImpl : torch::nn::Module {
  // `tp` (default: serial) says how layers are cut and `plan` (default: everything) which parts this
  // pipeline rank holds; a parallel model is initialised as the serial one from the same seed, each
  // rank keeping its parts and blocks. With `sequence` on, each rank of its group computes one
  // contiguous chunk of every sequence's positions (attention exchanges the rest).
  explicit GPTImpl(const GPTConfig& config, parallel::TensorParallel tp = {}, std::optional<StagePlan> plan = {},
                   parallel::sequence::SequenceParallel sequence = {});

  // Logits [B, T, V] for tokens [B, T] (gathered on every rank under tensor parallelism). With
  // `caches` (one per layer) the tokens continue the cached sequence and their keys/values are appended.
  torch::Tensor forward(const torch::Tensor& tokens, std::vector<nn::KVCache>* caches = nullptr);
  // Mean cross-entropy of next-token prediction, never gathering the logits. Under tensor parallelism
  // every rank of the group passes the same whole batch; each computes the rows its mode gives it.
  // Under sequence parallelism likewise, and each returns the mean over its chunk of positions.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);

  // The model's pieces, for pipeline stages (and composed by forward and loss):
  // tokens [B, T] continuing `past` cached positions -> the residual stream (this rank's block);
  torch::Tensor embed(const torch::Tensor& tokens, int64_t past = 0);
  // the stream through layers [begin, end), which this rank must hold;
  torch::Tensor run_blocks(torch::Tensor x, int64_t begin, int64_t end, std::vector<nn::KVCache>* caches = nullptr);
  // the final stream -> mean cross-entropy against targets [B, T] (the whole batch).
  torch::Tensor stage_loss(const torch::Tensor& x, const torch::Tensor& targets);

  GPTConfig config;
  parallel::TensorParallel tp;
  StagePlan plan;
  parallel::sequence::SequenceParallel sequence;
  Transformer transformer{nullptr};
  // Called around the embeddings, each layer and the output layer with its loss (null: none).
  nn::BlockHooks* block_hooks = nullptr;

 private:
  torch::Tensor local_logits(const torch::Tensor& x);  // tied output layer: this rank's block of the logits
  nn::BlockCall head_call() const;  // final norm + tied output layer, for the block hooks
  void initialize();
  void keep_only_planned_parts();
};
TORCH_MODULE(GPT);

struct SamplingOptions {
  int64_t max_new_tokens = 200;
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  uint64_t seed = 0;
  std::optional<int64_t> stop_token;
};

// Continues `prompt` (token ids) with the KV cache; returns only the new tokens.
std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, const SamplingOptions& options);

// Keeps the logits a sampler may choose from (top-k, then nucleus top-p); others become -inf.
torch::Tensor filter_logits(torch::Tensor logits, int64_t top_k, double top_p);  // logits [V]

}  // namespace kuafu::gpt

// What every causal language model built from nn::TransformerBlock shares around its own embeddings
// and final layers (GPT-2, OPT; next, RLHF's reward and value models): the blocks run with caches and a
// padding mask, the tied output layer's loss in float32, the evaluation sums, and the nn::Decoder that
// generation drives.
#pragma once

#include <vector>

#include "core/hooks/block_model.h"
#include "core/nn/generation.h"
#include "core/nn/transformer_block.h"
#include "core/parallel/tensor/embedding.h"

namespace kuafu::nn {

// `blocks` over x [B, T, C]; with `caches` (one per block, made on first use) each continues its cache.
// With `sites` (the model's block sites), each block runs through its site, so the strategies acting on
// blocks (Gemini gathering a block's chunks) act on this call too: a decode step under the run's layout.
torch::Tensor run_blocks(std::vector<TransformerBlock>& blocks, torch::Tensor x, std::vector<ops::KVCache>* caches,
                         const ops::AttentionMask& mask = {}, const hooks::BlockSites* sites = nullptr);

// One decoding step of a causal language model through its block sites, so that the strategies acting
// on blocks act on generation too (Gemini gathers each part's chunks around it): its head part runs
// `embed` (the step's tokens and positions -> the stream), each of `blocks` continues its cache (none
// when `caches` is null: whole rows at once, as RLHF scores them), and its tail part runs `tail` (the
// final stream -> whole logits [B, T, V], or what else the caller reads there).
torch::Tensor decode_through_sites(hooks::BlockModel& model, std::vector<TransformerBlock>& blocks, const DecodeStep& step,
                                   std::vector<ops::KVCache>* caches,
                                   const std::function<torch::Tensor(const DecodeStep&)>& embed,
                                   const std::function<torch::Tensor(const torch::Tensor&)>& tail);
// The same through `sites` whose head and tail parts are named `head` and `tail` (a model that is no
// BlockModel: a reward model's sites, whose tail holds its score head).
torch::Tensor decode_through_sites(const hooks::BlockSites& sites, const std::string& head, const std::string& tail_part,
                                   std::vector<TransformerBlock>& blocks, const DecodeStep& step,
                                   std::vector<ops::KVCache>* caches,
                                   const std::function<torch::Tensor(const DecodeStep&)>& embed,
                                   const std::function<torch::Tensor(const torch::Tensor&)>& tail);

// Packed rows (several documents per row, each attending only to itself): each position's index within
// its document, from documents [B, T] whose ids are contiguous runs. Models add their own offset.
torch::Tensor positions_in_documents(const torch::Tensor& documents);

// Mean cross-entropy of the tied output layer's logits for the final hidden states (this rank's block)
// against targets (TokenEmbeddingImpl::output_loss). The softmax runs in float32 whatever the compute
// dtype: bf16 logits would round the loss itself.
torch::Tensor tied_output_loss(parallel::TokenEmbeddingImpl& embedding, const torch::Tensor& hidden,
                               const torch::Tensor& targets);

// [loss sum, tokens, 0] (float64): the evaluation sums of a mean loss over `targets`' learned tokens.
torch::Tensor token_loss_sums(const torch::Tensor& mean_loss, const torch::Tensor& targets);

}  // namespace kuafu::nn

// What fine-tuning, RLHF and chat use of a causal language model, whichever its family (GPT-2, OPT):
// the block model the trainer runs, decoding with caches, whole rows' logits with padding anywhere,
// and the trunk a scalar head reads (a reward or value model: embeddings, blocks, final hidden states).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/hooks/block_model.h"
#include "core/io/targets.h"
#include "core/nn/generation.h"
#include "core/nn/transformer_block.h"
#include "core/parallel/tensor/factory.h"

namespace kuafu::nn {

class CausalLM : public hooks::OneStreamModel {
 public:
  // Logits [B, T, V] of rows at their own positions with left padding, continuing `caches` (generation):
  // embed_at, the layers and output_logits, each part through its block site.
  virtual torch::Tensor decode(const DecodeStep& step, std::vector<ops::KVCache>& caches);
  // Whole logits [B, T, V] of whole rows with padding anywhere (whole_rows_step): decode's without a cache.
  virtual torch::Tensor whole_logits(const DecodeStep& step);
  // tokens [B, T], positions [B or 1, T] (counts of real tokens before each) -> the residual stream [B, T, H].
  virtual torch::Tensor embed_at(const torch::Tensor& tokens, const torch::Tensor& positions) = 0;
  virtual std::vector<TransformerBlock>& layers() = 0;
  // The final stream [B, T, H] -> whole logits [B, T, V]: final norm (and projection) and the tied
  // output layer, gathered under tensor parallelism.
  virtual torch::Tensor output_logits(const torch::Tensor& x) = 0;
  // The final stream [B, T, H] -> the hidden states [B, T, final_width()] an output layer or a head
  // reads (final norm, and OPT's projection out where it has one).
  virtual torch::Tensor final_hidden(const torch::Tensor& x) = 0;
  virtual int64_t final_width() const = 0;
  // The tail part's modules final_hidden runs (the tail less the tied output layer).
  virtual std::vector<std::string> final_modules() const = 0;
  virtual int64_t positions() const = 0;   // the longest sequence
  virtual int64_t vocab_size() const = 0;  // rows of the output layer
  virtual std::string family() const = 0;  // for messages: "OPT", "GPT-2"
  // The family's random initialisation of every parameter, from the global generator. A model built on
  // the meta device (lazy construction) is initialised by this once train::materialize has given its
  // parameters storage; on any other device its constructor calls it.
  virtual void initialize() = 0;

  // hooks::BlockModel's head and blocks, the same for every family: inputs are tokens [B, T] at positions
  // 0..T-1, or packed rows [B, 2, T] (token ids over document ids, contiguous runs), each document
  // attending only to itself with positions counted from its own start.
  torch::Tensor head(const torch::Tensor& inputs) override;
  // Packed rows' documents [B, T] (undefined for unpacked rows), which keep each block's attention within them.
  torch::Tensor block_context(const torch::Tensor& inputs) const override;
  torch::Tensor block(int64_t i, const torch::Tensor& x, const torch::Tensor& documents) override;
  bool tail_per_position() const override { return true; }
  // Mean next-token cross-entropy of `inputs` (as head's) against `targets`, never gathering the logits.
  torch::Tensor loss(const torch::Tensor& inputs, const torch::Tensor& targets);
  // The learned targets (not io::kIgnoredTarget: the answers of instruction rows).
  torch::Tensor tail_items(const torch::Tensor& targets) const override {
    return (targets != io::kIgnoredTarget).sum().to(torch::kFloat64);
  }

  parallel::TensorParallel tp;  // how its layers are cut (default: serial)
};

using CausalLMPtr = std::shared_ptr<CausalLM>;

// Whether `model`'s decoding step is only tensor operations a CUDA graph can capture: no strategy's block
// hooks (Gemini and frozen offload move weights and communicate; ZeRO-2 installs none), no tensor parallelism
// (collectives), no rotary schedule that reads the longest position on the host ("dynamic").
bool decodes_capturably(CausalLM& model);

// The decoder generation drives.
inline Decoder decoder_of(const CausalLMPtr& model) {
  Decoder decoder{[model](const DecodeStep& step, std::vector<ops::KVCache>& caches) { return model->decode(step, caches); },
                  model->positions(), model->module().parameters().front().device(), /*all_done=*/nullptr};
  decoder.capturable = decodes_capturably(*model);
  return decoder;
}

}  // namespace kuafu::nn

// A sequential model: a head turning the inputs into a stream, blocks each mapping the stream to the
// next, and a tail turning the final stream and the targets into a loss. It is the shape pipeline
// staging and sequence parallelism need, an extra beside the general form (hooks::SiteModel, whose
// blocks take and return any tensors): a model file writes only this maths, and ParallelModel
// (core/train/parallelize.h) makes its head, blocks and tail the block sites every other strategy
// applies to.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "core/hooks/block_sites.h"

namespace kuafu::hooks {

class BlockModel : public SiteModel {
 public:
  // module(): the model's root module (the parts' paths start there).
  // The head, each block and the tail as sites, named as their parts: all of them until use_parts
  // keeps a pipeline stage's (ParallelModel does), so the strategies reach a model run whole without one.
  BlockSites& block_sites() final;
  // Makes the sites those of the parts one rank holds: the head when `first`, the blocks `holds_block`
  // keeps (null: all), the tail when `last`. Any hooks and wrappers on the old sites are dropped.
  void use_parts(bool first, bool last, const std::function<bool(int64_t block)>& holds_block = nullptr);

  virtual int64_t num_blocks() const = 0;
  virtual ModelPart head_part() const = 0;
  virtual ModelPart block_part(int64_t i) const = 0;
  virtual ModelPart tail_part() const = 0;

  // inputs (token ids [B, T], pixels [B, C, S, S], ...) -> the stream [B, T, ...]: its dim 1 holds the
  // positions that sequence parallelism cuts.
  virtual torch::Tensor head(const torch::Tensor& inputs) = 0;
  // What the blocks need of a micro-batch besides the stream, from its inputs: packed rows' documents
  // [B, T] (each position attending only within its own); undefined when nothing. It travels with the
  // batch, not inside the model: each pipeline stage computes it from the micro-batch it runs, and
  // under sequence parallelism every rank keeps it whole (its attention picks the positions it needs).
  virtual torch::Tensor block_context(const torch::Tensor& /*inputs*/) const { return {}; }
  // `context`: block_context's for this micro-batch.
  virtual torch::Tensor block(int64_t i, const torch::Tensor& x, const torch::Tensor& context) = 0;
  // The mean loss of the final stream against training targets.
  virtual torch::Tensor tail_loss(const torch::Tensor& x, const torch::Tensor& targets) = 0;
  // Evaluation sums against evaluation targets: float64 [loss sum, items, items predicted right].
  virtual torch::Tensor tail_sums(const torch::Tensor& x, const torch::Tensor& targets) = 0;
  // True when the tail treats the positions independently and the targets' dim 1 lines up with the
  // stream's (next-token prediction): sequence parallelism then cuts the targets as it cuts the stream
  // and each rank's loss is the mean over its positions. False: the tail needs the whole stream (e.g.
  // a classifier reading the class token), which is gathered first.
  virtual bool tail_per_position() const { return false; }
  // How many items tail_loss's mean averages over in `targets`, a 0-dim tensor (no host sync). Under
  // sequence parallelism each rank's mean is weighted by its share of them, so that the ranks' average
  // is the whole row's mean even when some targets are not learned (a loss on answers only).
  virtual torch::Tensor tail_items(const torch::Tensor& targets) const {
    return torch::scalar_tensor(static_cast<double>(targets.numel()), targets.options().dtype(torch::kFloat64));
  }

 private:
  BlockSites sites_;
  bool sites_made_ = false;
};

}  // namespace kuafu::hooks

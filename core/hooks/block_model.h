// A sequential model: a head turning a batch into streams, blocks each mapping the streams to the next,
// and a tail turning the final streams and the batch into a loss. It is the shape pipeline staging,
// sequence parallelism and recycling need, an extra beside the general form (hooks::SiteModel, whose
// blocks take and return any tensors): a model file writes only this maths, and ParallelModel
// (core/train/parallelize.h) makes its head, blocks and tail the block sites every other strategy
// applies to.
//
// The streams are a list of tensors (hooks::Tensors): one for a language model or a ViT (OneStreamModel
// below), AlphaFold's MSA and pair (and its extra MSA until the extra-MSA stack ends).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "core/hooks/batch.h"
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

  // The batch (and what the previous recycling iteration handed on: empty before the first) -> the streams.
  virtual Tensors head_streams(const Batch& batch, const Tensors& recycled) = 0;
  // Block `i` on the streams; it reads what else it needs of the batch (masks, packed rows' documents).
  virtual Tensors block_streams(int64_t i, const Tensors& streams, const Batch& batch) = 0;
  // The mean loss of the final streams against the batch's labels.
  virtual torch::Tensor tail_loss_streams(const Tensors& streams, const Batch& batch) = 0;
  // Evaluation sums of the final streams: float64 [loss sum, items, items predicted right].
  virtual torch::Tensor tail_sums_streams(const Tensors& streams, const Batch& batch) = 0;

  // Recycling (AlphaFold 2's Algorithm 2): how many times a batch runs through the head, blocks and tail,
  // every run but the last without gradient; the features run `i` reads; what the tail of a run hands the
  // next run's head (recycled_streams runs the tail's forward, no loss).
  virtual int64_t iterations(const Batch& /*batch*/) const { return 1; }
  virtual Batch iteration_batch(const Batch& batch, int64_t /*i*/) const { return batch; }
  virtual Tensors recycled_streams(const Tensors& final_streams, const Batch& batch);

  // The parts through their block sites (the hooks and wrappers strategies put there): the head, blocks
  // [begin, end), the tail's loss or sums, or what it recycles.
  Tensors call_head(const Batch& batch, const Tensors& recycled);
  Tensors call_blocks(Tensors streams, int64_t begin, int64_t end, const Batch& batch);
  torch::Tensor call_tail(const Tensors& streams, const Batch& batch, bool sums);
  Tensors call_recycled(const Tensors& streams, const Batch& batch);
  // One iteration's head (reading `recycled`, let go once embedded so the blocks may use its memory) and
  // every block: the final streams.
  Tensors call_head_and_blocks(const Batch& batch, Tensors recycled);
  // Every recycling iteration but the last, without gradient, through the sites: what the last one's head
  // reads (empty when the batch runs once).
  Tensors recycle(const Batch& batch);

 private:
  BlockSites sites_;
  bool sites_made_ = false;
};

// The common case: one stream, whose dim 1 holds the positions that sequence parallelism cuts; the head
// reads the batch's inputs and the tail its targets.
class OneStreamModel : public BlockModel {
 public:
  // inputs (token ids [B, T], pixels [B, C, S, S], ...) -> the stream [B, T, ...].
  virtual torch::Tensor head(const torch::Tensor& inputs) = 0;
  // What the blocks need of a micro-batch besides the stream, from its inputs: packed rows' documents
  // [B, T] (each position attending only within its own); undefined when nothing. Each pipeline stage
  // computes it from the micro-batch it runs, and under sequence parallelism every rank keeps it whole
  // (its attention picks the positions it needs).
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

  // The general form over the one stream.
  Tensors head_streams(const Batch& batch, const Tensors& recycled) final;
  Tensors block_streams(int64_t i, const Tensors& streams, const Batch& batch) final;
  torch::Tensor tail_loss_streams(const Tensors& streams, const Batch& batch) final;
  torch::Tensor tail_sums_streams(const Tensors& streams, const Batch& batch) final;
};

}  // namespace kuafu::hooks

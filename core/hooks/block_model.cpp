#include "core/hooks/block_model.h"

#include <torch/torch.h>

#include "core/util/error.h"

namespace kuafu::hooks {

BlockSites& BlockModel::block_sites() {
  if (!sites_made_) use_parts(/*first=*/true, /*last=*/true);
  return sites_;
}

void BlockModel::use_parts(bool first, bool last, const std::function<bool(int64_t)>& holds_block) {
  std::vector<ModelPart> parts;
  if (first) parts.push_back(head_part());
  for (int64_t i = 0; i < num_blocks(); ++i) {
    if (!holds_block || holds_block(i)) parts.push_back(block_part(i));
  }
  if (last) parts.push_back(tail_part());
  sites_ = BlockSites::of_parts(module(), parts);
  sites_made_ = true;
}

Tensors BlockModel::recycled_streams(const Tensors& /*final_streams*/, const Batch& /*batch*/) {
  fail("this model runs each batch once: it recycles nothing");
}

// Each body holds copies of what it reads besides its inputs (the batch): a checkpointed block runs it again
// during backward, after the caller's batch is gone.
Tensors BlockModel::call_head(const Batch& batch, const Tensors& recycled) {
  return block_sites().call(head_part().name, recycled, [this, batch](const Tensors& in) { return head_streams(batch, in); });
}

Tensors BlockModel::call_blocks(Tensors streams, int64_t begin, int64_t end, const Batch& batch) {
  BlockSites& sites = block_sites();
  for (int64_t i = begin; i < end; ++i) {
    streams = sites.call(block_part(i).name, streams, [this, i, batch](const Tensors& in) { return block_streams(i, in, batch); });
  }
  return streams;
}

torch::Tensor BlockModel::call_tail(const Tensors& streams, const Batch& batch, bool sums) {
  return block_sites().call(tail_part().name, streams, [this, batch, sums](const Tensors& in) {
    return Tensors{sums ? tail_sums_streams(in, batch) : tail_loss_streams(in, batch)};
  })[0];
}

Tensors BlockModel::call_recycled(const Tensors& streams, const Batch& batch) {
  return block_sites().call(tail_part().name, streams, [this, batch](const Tensors& in) { return recycled_streams(in, batch); });
}

Tensors BlockModel::call_head_and_blocks(const Batch& batch, Tensors recycled) {
  Tensors streams = call_head(batch, recycled);
  recycled.clear();
  return call_blocks(std::move(streams), 0, num_blocks(), batch);
}

Tensors BlockModel::recycle(const Batch& batch) {
  const int64_t n = iterations(batch);
  Tensors recycled;
  for (int64_t i = 0; i + 1 < n; ++i) {
    torch::NoGradGuard no_grad;
    const Batch features = iteration_batch(batch, i);
    recycled = call_recycled(call_head_and_blocks(features, std::move(recycled)), features);
  }
  return recycled;
}

Tensors OneStreamModel::head_streams(const Batch& batch, const Tensors& /*recycled*/) { return {head(batch.inputs)}; }

Tensors OneStreamModel::block_streams(int64_t i, const Tensors& streams, const Batch& batch) {
  return {block(i, streams.at(0), block_context(batch.inputs))};
}

torch::Tensor OneStreamModel::tail_loss_streams(const Tensors& streams, const Batch& batch) {
  return tail_loss(streams.at(0), batch.targets);
}

torch::Tensor OneStreamModel::tail_sums_streams(const Tensors& streams, const Batch& batch) {
  return tail_sums(streams.at(0), batch.targets);
}

}  // namespace kuafu::hooks

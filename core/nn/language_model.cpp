#include "core/nn/language_model.h"

#include "core/nn/causal_lm.h"
#include "core/util/error.h"

namespace kuafu::nn {

torch::Tensor run_blocks(std::vector<TransformerBlock>& blocks, torch::Tensor x, std::vector<ops::KVCache>* caches,
                         const ops::AttentionMask& mask, const hooks::BlockSites* sites) {
  if (caches && caches->empty()) caches->resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    ops::KVCache* cache = caches ? &(*caches)[i] : nullptr;
    auto body = [block = blocks[i], cache, mask](const torch::Tensor& input) mutable {
      return block->forward(input, cache, mask);
    };
    x = sites ? sites->call(*blocks[i], x, body) : body(x);
  }
  return x;
}

torch::Tensor decode_through_sites(hooks::BlockModel& model, std::vector<TransformerBlock>& blocks, const DecodeStep& step,
                                   std::vector<ops::KVCache>* caches,
                                   const std::function<torch::Tensor(const DecodeStep&)>& embed,
                                   const std::function<torch::Tensor(const torch::Tensor&)>& tail) {
  return decode_through_sites(model.block_sites(), model.head_part().name, model.tail_part().name, blocks, step, caches,
                              embed, tail);
}

torch::Tensor decode_through_sites(const hooks::BlockSites& sites, const std::string& head, const std::string& tail_part,
                                   std::vector<TransformerBlock>& blocks, const DecodeStep& step,
                                   std::vector<ops::KVCache>* caches,
                                   const std::function<torch::Tensor(const DecodeStep&)>& embed,
                                   const std::function<torch::Tensor(const torch::Tensor&)>& tail) {
  const torch::Tensor x = sites.call(head, step.tokens, [&](const torch::Tensor&) { return embed(step); });
  ops::AttentionMask mask(step.key_padding);
  mask.positions = step.positions;  // for blocks that rotate by position
  return sites.call(tail_part, run_blocks(blocks, x, caches, mask, &sites), tail);
}

torch::Tensor positions_in_documents(const torch::Tensor& documents) {
  const int64_t t = documents.size(1);
  const torch::Tensor index = torch::arange(t, documents.options().dtype(torch::kInt64)).expand_as(documents);
  // A document starts where the id changes; each position counts from the latest start before it.
  torch::Tensor starts = documents.narrow(1, 1, t - 1).ne(documents.narrow(1, 0, t - 1));
  starts = torch::cat({torch::ones_like(documents.narrow(1, 0, 1), starts.options()), starts}, 1);
  const torch::Tensor first = std::get<0>(torch::where(starts, index, torch::zeros_like(index)).cummax(1));
  return index - first;
}

torch::Tensor tied_output_loss(parallel::TokenEmbeddingImpl& embedding, const torch::Tensor& hidden,
                               const torch::Tensor& targets) {
  return embedding.output_loss(hidden, targets);
}

torch::Tensor token_loss_sums(const torch::Tensor& mean_loss, const torch::Tensor& targets) {
  const double tokens = static_cast<double>((targets != parallel::kIgnoredTarget).sum().item<int64_t>());
  const torch::Tensor mean = mean_loss.detach().to(torch::kFloat64).reshape({1});
  return torch::cat({mean * tokens, torch::tensor({tokens, 0.0}, mean.options())});
}

namespace {

// Packed inputs [B, 2, T]'s documents [B, T], whole; undefined for unpacked inputs [B, T].
torch::Tensor documents_of(const torch::Tensor& inputs, const std::string& family) {
  if (inputs.dim() != 3) return {};
  KUAFU_CHECK(inputs.size(1) == 2, "packed ", family, " inputs are [B, 2, T] (token ids over document ids), got ", inputs.sizes());
  return inputs.select(1, 1);
}

}  // namespace

torch::Tensor CausalLM::block_context(const torch::Tensor& inputs) const {
  const torch::Tensor documents = documents_of(inputs, family());
  // The stream's rows: 2D, 2.5D and 3D cut the batch (sequence parallelism keeps the positions whole).
  return documents.defined() ? parallel::stream_rows(tp, documents) : documents;
}

torch::Tensor CausalLM::head(const torch::Tensor& inputs) {
  KUAFU_CHECK(inputs.size(-1) <= positions(), "a sequence of ", inputs.size(-1), " tokens exceeds the ", family(),
              " model's ", positions(), " positions");
  // The embeddings take every row (a cut embedding picks its rows itself).
  if (const torch::Tensor documents = documents_of(inputs, family()); documents.defined()) {
    return embed_at(inputs.select(1, 0), positions_in_documents(documents));
  }
  return embed_at(inputs, torch::arange(inputs.size(1), inputs.options().dtype(torch::kInt64)).unsqueeze(0));
}

torch::Tensor CausalLM::loss(const torch::Tensor& inputs, const torch::Tensor& targets) {
  return tail_loss(run_blocks(layers(), head(inputs), nullptr, ops::AttentionMask({}, block_context(inputs))), targets);
}

namespace {

// The rows through the head, the layers (continuing `caches` unless null) and the tail, each part through
// its block site: whole logits.
torch::Tensor logits_through_sites(CausalLM& model, const DecodeStep& step, std::vector<ops::KVCache>* caches) {
  return decode_through_sites(
      model, model.layers(), step, caches, [&](const DecodeStep& s) { return model.embed_at(s.tokens, s.positions); },
      [&](const torch::Tensor& x) { return model.output_logits(x); });
}

}  // namespace

torch::Tensor CausalLM::decode(const DecodeStep& step, std::vector<ops::KVCache>& caches) {
  return logits_through_sites(*this, step, &caches);
}

bool decodes_capturably(CausalLM& model) {
  if (model.block_sites().has_hooks() || model.tp.enabled()) return false;
  for (const TransformerBlock& layer : model.layers()) {
    if (layer->spec.rotary && layer->spec.rotary->type == "dynamic") return false;
  }
  return true;
}

torch::Tensor CausalLM::whole_logits(const DecodeStep& step) { return logits_through_sites(*this, step, nullptr); }

torch::Tensor CausalLM::block(int64_t i, const torch::Tensor& x, const torch::Tensor& documents) {
  return layers()[static_cast<size_t>(i)]->forward(x, nullptr, ops::AttentionMask({}, documents));
}

}  // namespace kuafu::nn

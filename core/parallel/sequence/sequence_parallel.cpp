#include "core/parallel/sequence/sequence_parallel.h"

#include "core/dist/autograd_collectives.h"
#include "core/ops/attention.h"
#include "core/parallel/sequence/ring_attention.h"
#include "core/util/error.h"

namespace kuafu::parallel::sequence {

void add_sequence_parallel_schema(config::Schema& s) {
  s.add_string("parallel.sequence.mode", "none",
               "sequence parallelism: none, ring (blockwise, online softmax), ring_scores (full score rows), "
               "all_to_all (Ulysses; heads must divide by the size)")
      .choices({"none", "ring", "ring_scores", "all_to_all"});
  s.add_int("parallel.sequence.size", 1, "ranks each sequence is cut across (contiguous chunks)").min(1);
}

SequenceMode sequence_mode(const std::string& name) {
  if (name == "none") return SequenceMode::kNone;
  if (name == "ring") return SequenceMode::kRing;
  if (name == "ring_scores") return SequenceMode::kRingScores;
  if (name == "all_to_all") return SequenceMode::kAllToAll;
  fail("unknown sequence-parallel mode '" + name + "' (expected none, ring, ring_scores or all_to_all)");
}

SequenceParallel sequence_parallel_spec(const config::Config& config) {
  SequenceParallel sp;
  sp.mode = sequence_mode(config.get_string("parallel.sequence.mode"));
  sp.size = static_cast<int>(config.get_int("parallel.sequence.size"));
  if (!sp.enabled() && sp.size != 1) {
    config.fail_at("parallel.sequence.size", "is " + std::to_string(sp.size) + " but parallel.sequence.mode is \"none\"");
  }
  return sp;
}

torch::Tensor all_to_all_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   dist::GroupPtr group, bool causal, double dropout, const torch::Tensor& documents) {
  const int p = group->size();
  KUAFU_CHECK(q.size(1) % p == 0, "all-to-all sequence parallelism needs the attention heads (", q.size(1),
              ") to divide by the sequence-parallel size (", p, ")");
  // [B, H, C, D] sequence-split -> [B, H/P, n, D] head-split, and back after attention.
  auto to_heads = [&](const torch::Tensor& t) { return dist::autograd::all_to_all(t, group, 1, 2); };
  // After the exchange each rank holds the whole sequence of its heads: the whole rows' documents apply.
  const torch::Tensor out = ops::scaled_dot_product_attention(to_heads(q), to_heads(k), to_heads(v), causal, dropout,
                                                              ops::AttentionMask({}, documents));
  return dist::autograd::all_to_all(out, group, 2, 1);
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                        double dropout, const SequenceParallel& sp, const torch::Tensor& documents) {
  switch (sp.mode) {
    case SequenceMode::kNone:
      return ops::scaled_dot_product_attention(q, k, v, causal, dropout, ops::AttentionMask({}, documents));
    case SequenceMode::kAllToAll: return all_to_all_attention(q, k, v, sp.group, causal, dropout, documents);
    case SequenceMode::kRing:
    case SequenceMode::kRingScores:
      KUAFU_CHECK(dropout == 0.0, "ring attention has no attention-probability dropout (got ", dropout,
                  "); set the model's dropout to 0 or use all_to_all sequence parallelism");
      return sp.mode == SequenceMode::kRing ? blockwise_ring_attention(q, k, v, sp.group, causal, sp.query_tile, documents)
                                            : ring_self_attention(q, k, v, sp.group, causal, documents);
  }
  fail("unknown sequence-parallel mode");
}

torch::Tensor local_chunk(const torch::Tensor& x, int64_t dim, const SequenceParallel& sp) {
  if (!sp.enabled() || sp.size == 1) return x;
  const int64_t length = x.size(dim);
  KUAFU_CHECK(length % sp.size == 0, "a sequence of ", length, " positions cannot be cut into ", sp.size,
              " equal chunks for sequence parallelism; use a length that divides by ", sp.size);
  const int64_t chunk = length / sp.size;
  return x.narrow(dim, sp.rank() * chunk, chunk);
}

torch::Tensor gather_chunks(const torch::Tensor& x, int64_t dim, const SequenceParallel& sp) {
  if (!sp.enabled() || sp.size == 1) return x;
  return dist::autograd::all_gather(x, sp.group, dim);
}

}  // namespace kuafu::parallel::sequence

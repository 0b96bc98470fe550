#include "core/parallel/sequence/ring_attention.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "core/dist/autograd_group.h"
#include "core/dist/collectives.h"
#include "core/util/error.h"

namespace kuafu::parallel::sequence {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

// Point-to-point tags: blocks that are read (keys, values) and the gradient sums that travel with them
// go to the same neighbour at once, so they need separate tags (one per tensor from these on).
constexpr int kBlockTag = 64;
constexpr int kGradientTag = 96;

// Sends `blocks` to the next rank of the ring and receives the previous rank's blocks of the same
// shapes (one message each, tags `tag`, `tag` + 1, ...). Even ranks post the sends first and odd ranks
// the receives, so that backends whose point-to-point operations on one pair of ranks run in order
// (NCCL) pair them up instead of waiting on each other.
using Blocks = std::vector<torch::Tensor>;
class RingShift {
 public:
  RingShift(const Blocks& blocks, const dist::ProcessGroup& group, int tag) {
    if (group.trivial()) {
      own_ = blocks;
      return;
    }
    const int r = group.rank(), p = group.size();
    for (size_t i = 0; i < blocks.size(); ++i) {
      const torch::Tensor wire = blocks[i].contiguous();
      const int t = tag + static_cast<int>(i);
      if (r % 2 == 0) sends_.push_back(dist::send_async(wire, group, (r + 1) % p, t));
      receives_.push_back(dist::recv_async(wire, group, (r + p - 1) % p, t));
      if (r % 2 == 1) sends_.push_back(dist::send_async(wire, group, (r + 1) % p, t));
    }
  }
  Blocks wait() {
    if (!own_.empty()) return own_;
    Blocks received;
    for (auto& pending : receives_) received.push_back(pending.wait());
    for (auto& send : sends_) send.wait();
    return received;
  }

 private:
  Blocks own_;  // a ring of one: the blocks come back to themselves
  std::vector<dist::PendingSend> sends_;
  std::vector<dist::PendingTensor> receives_;
};

// Passes `blocks` once round the ring, calling visit(owner, blocks) on each rank's blocks in turn while
// the next ones are in flight. When `gather_contributions`, visit returns its contributions to the
// gradients of those blocks (same shapes); the running sums travel one hop behind the blocks, and this
// rank's own sums (over all ranks' contributions) are returned after the last hop.
using Visit = std::function<Blocks(int owner, const Blocks& blocks)>;
Blocks ring_pass(Blocks blocks, const dist::ProcessGroup& group, bool gather_contributions, const Visit& visit) {
  const int r = group.rank(), p = group.size();
  std::optional<RingShift> sums_in_flight;
  for (int step = 0; step < p; ++step) {
    std::optional<RingShift> next;
    if (step + 1 < p) next.emplace(blocks, group, kBlockTag);
    Blocks sums = visit((r - step + p) % p, blocks);
    if (gather_contributions) {
      if (step > 0) {
        Blocks arrived = sums_in_flight->wait();
        for (size_t i = 0; i < sums.size(); ++i) sums[i] = arrived[i].add_(sums[i]);
      }
      sums_in_flight.emplace(sums, group, kGradientTag);
    }
    if (next) blocks = next->wait();
  }
  return gather_contributions ? sums_in_flight->wait() : Blocks();
}

torch::ScalarType accumulation_type(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// How the queries of chunk `queries` see the keys of chunk `keys` under a causal mask.
enum class Visibility { kAll, kDiagonal, kNone };
Visibility visibility(bool causal, int keys, int queries) {
  if (!causal || keys < queries) return Visibility::kAll;
  return keys == queries ? Visibility::kDiagonal : Visibility::kNone;
}

// Packed rows' documents, passed to the autograd functions as a value (not an input: ids have no
// gradient, and an undefined tensor cannot be one).
struct Documents {
  torch::Tensor ids;  // [B, n] int64 for the whole sequence; undefined when unpacked
};

// Packed rows: which keys of chunk `key_chunk` are in the same document as query rows [first, first +
// rows) of chunk `query_chunk`, [B, 1, rows, C] (documents [B, n] of the whole sequence, every rank's
// copy); undefined when the rows are not packed.
torch::Tensor same_document(const torch::Tensor& documents, int query_chunk, int64_t first, int64_t rows, int key_chunk,
                            int64_t c) {
  if (!documents.defined()) return {};
  const torch::Tensor queries = documents.narrow(1, query_chunk * c + first, rows);  // [B, rows]
  const torch::Tensor keys = documents.narrow(1, key_chunk * c, c);                  // [B, C]
  return queries.unsqueeze(2).eq(keys.unsqueeze(1)).unsqueeze(1);
}

// Scores of query rows [first, first + rows) of this chunk against one key chunk, masked on the diagonal
// chunk (query i sees key j <= i) and, for packed rows, outside each query's document (`same`). The
// diagonal keeps every row's own key, so no row is masked whole.
torch::Tensor scores(const torch::Tensor& q_tile, const torch::Tensor& keys, double scale, Visibility seen,
                     int64_t first, const torch::Tensor& same = {}) {
  torch::Tensor s = torch::matmul(q_tile, keys.transpose(-2, -1)) * scale;  // [B, H, rows, C]
  if (seen == Visibility::kDiagonal) {
    const auto options = torch::TensorOptions().dtype(torch::kInt64).device(s.device());
    torch::Tensor query = torch::arange(first, first + s.size(-2), options).unsqueeze(1);
    torch::Tensor key = torch::arange(s.size(-1), options).unsqueeze(0);
    s = s.masked_fill(key > query, -std::numeric_limits<double>::infinity());
  }
  if (same.defined()) s = s.masked_fill(same.logical_not(), -std::numeric_limits<double>::infinity());
  return s;
}

void check_chunks(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const char* what) {
  KUAFU_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(), what,
              ": q, k and v must be [B, H, C, D] chunks of one shape, got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
}

// What both ring functions keep for backward besides their tensors.
void save_settings(AutogradContext* ctx, bool causal, torch::ScalarType input_dtype, dist::GroupPtr group,
                   const torch::Tensor& documents) {
  ctx->saved_data["causal"] = causal;
  ctx->saved_data["dtype"] = static_cast<int64_t>(input_dtype);
  ctx->saved_data["documents"] = documents;
  dist::autograd::save_group(ctx, std::move(group));
}
struct Settings {
  bool causal;
  torch::ScalarType input_dtype;  // the gradients are returned in it
  const dist::ProcessGroup& group;
  torch::Tensor documents;  // packed rows' documents [B, n]; undefined when unpacked
};
Settings saved_settings(AutogradContext* ctx) {
  const c10::IValue& documents = ctx->saved_data["documents"];
  return {ctx->saved_data["causal"].toBool(), static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt()),
          dist::autograd::saved_group(ctx), documents.isTensor() ? documents.toTensor() : torch::Tensor()};
}
double score_scale(const torch::Tensor& q) { return 1.0 / std::sqrt(static_cast<double>(q.size(3))); }

// ---- Ring self-attention: the full score rows. ----

struct RingSelfAttention : Function<RingSelfAttention> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
                               const torch::Tensor& v_in, dist::GroupPtr group, bool causal, Documents packed) {
    const torch::Tensor& documents = packed.ids;
    const auto acc = accumulation_type(q_in);
    const torch::Tensor q = q_in.to(acc), k = k_in.to(acc), v = v_in.to(acc);
    const int r = group->rank(), p = group->size();
    const int64_t c = q.size(2);
    const double scale = score_scale(q);
    // Pass 1, keys: scores [B, H, C, P C] in sequence order.
    torch::Tensor s = torch::full({q.size(0), q.size(1), c, c * p}, -std::numeric_limits<double>::infinity(),
                                  q.options());
    ring_pass({k}, *group, false, [&](int owner, const Blocks& keys) {
      const Visibility seen = visibility(causal, owner, r);
      if (seen != Visibility::kNone) {
        s.narrow(3, owner * c, c).copy_(scores(q, keys[0], scale, seen, 0, same_document(documents, r, 0, c, owner, c)));
      }
      return Blocks();
    });
    torch::Tensor a = torch::softmax(s, -1);
    s = torch::Tensor();
    // Pass 2, values: out = Σ_owner A[:, :, :, owner] V_owner.
    torch::Tensor out = torch::zeros_like(q);
    ring_pass({v}, *group, false, [&](int owner, const Blocks& values) {
      if (visibility(causal, owner, r) != Visibility::kNone) out.add_(torch::matmul(a.narrow(3, owner * c, c), values[0]));
      return Blocks();
    });
    ctx->save_for_backward({q, k, v, a});
    save_settings(ctx, causal, q_in.scalar_type(), std::move(group), documents);
    return out.to(q_in.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &a = saved[3];
    const Settings settings = saved_settings(ctx);
    const bool causal = settings.causal;
    const dist::ProcessGroup& group = settings.group;
    const int r = group.rank();
    const int64_t c = q.size(2);
    const double scale = score_scale(q);
    const torch::Tensor d_out = grads[0].to(q.scalar_type());
    // Pass 1, values: dA = dO Vᵀ per chunk; dV_owner = A_ownerᵀ dO travels home.
    torch::Tensor d_a = torch::zeros_like(a);
    const torch::Tensor d_v = ring_pass({v}, group, true, [&](int owner, const Blocks& values) {
      if (visibility(causal, owner, r) == Visibility::kNone) return Blocks{torch::zeros_like(values[0])};
      d_a.narrow(3, owner * c, c).copy_(torch::matmul(d_out, values[0].transpose(-2, -1)));
      return Blocks{torch::matmul(a.narrow(3, owner * c, c).transpose(-2, -1), d_out)};
    })[0];
    // Softmax backward over the whole row: dS = A ⊙ (dA − Σ_j dA A).
    torch::Tensor d_s = a * (d_a - (d_a * a).sum(-1, /*keepdim=*/true));
    d_a = torch::Tensor();
    // Pass 2, keys: dQ = Σ dS_owner K_owner; dK_owner = dS_ownerᵀ Q travels home.
    torch::Tensor d_q = torch::zeros_like(q);
    const torch::Tensor d_k = ring_pass({k}, group, true, [&](int owner, const Blocks& keys) {
      if (visibility(causal, owner, r) == Visibility::kNone) return Blocks{torch::zeros_like(keys[0])};
      const torch::Tensor block = d_s.narrow(3, owner * c, c);
      d_q.add_(torch::matmul(block, keys[0]), scale);
      return Blocks{torch::matmul(block.transpose(-2, -1), q) * scale};
    })[0];
    return {d_q.to(settings.input_dtype), d_k.to(settings.input_dtype), d_v.to(settings.input_dtype), torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

// ---- Blockwise ring attention: online softmax, nothing quadratic kept. ----

struct BlockwiseRingAttention : Function<BlockwiseRingAttention> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q_in, const torch::Tensor& k_in,
                               const torch::Tensor& v_in, dist::GroupPtr group, bool causal, int64_t tile,
                               Documents packed) {
    const torch::Tensor& documents = packed.ids;
    const auto acc = accumulation_type(q_in);
    const torch::Tensor q = q_in.to(acc);
    const int r = group->rank();
    const int64_t c = q.size(2);
    const double scale = score_scale(q);
    // Running row maximum m, normaliser l = Σ exp(s − m) and output o = Σ exp(s − m) v, per query row.
    torch::Tensor m = torch::full({q.size(0), q.size(1), c}, -std::numeric_limits<double>::infinity(), q.options());
    torch::Tensor l = torch::zeros_like(m);
    torch::Tensor o = torch::zeros_like(q);
    const torch::Tensor k = k_in.to(acc), v = v_in.to(acc);
    ring_pass({k, v}, *group, false, [&](int owner, const Blocks& block) {
      const Visibility seen = visibility(causal, owner, r);
      if (seen == Visibility::kNone) return Blocks();
      for (int64_t first = 0; first < c; first += tile) {
        const int64_t rows = std::min(tile, c - first);
        const torch::Tensor s =
            scores(q.narrow(2, first, rows), block[0], scale, seen, first, same_document(documents, r, first, rows, owner, c));
        torch::Tensor m_tile = m.narrow(2, first, rows);
        const torch::Tensor m_new = torch::maximum(m_tile, std::get<0>(s.max(-1)));
        const torch::Tensor probs = torch::exp(s - m_new.unsqueeze(-1));
        const torch::Tensor rescale = torch::exp(m_tile - m_new);  // 0 for rows seen for the first time
        torch::Tensor l_tile = l.narrow(2, first, rows);
        l_tile.mul_(rescale).add_(probs.sum(-1));
        torch::Tensor o_tile = o.narrow(2, first, rows);
        o_tile.mul_(rescale.unsqueeze(-1)).add_(torch::matmul(probs, block[1]));
        m_tile.copy_(m_new);
      }
      return Blocks();
    });
    o.div_(l.unsqueeze(-1));
    const torch::Tensor lse = m + torch::log(l);  // [B, H, C]
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["tile"] = tile;
    save_settings(ctx, causal, q_in.scalar_type(), std::move(group), documents);
    return o.to(q_in.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse = saved[4];
    const Settings settings = saved_settings(ctx);
    const bool causal = settings.causal;
    const dist::ProcessGroup& group = settings.group;
    const int64_t tile = ctx->saved_data["tile"].toInt();
    const int r = group.rank();
    const int64_t c = q.size(2);
    const double scale = score_scale(q);
    const torch::Tensor d_out = grads[0].to(q.scalar_type());
    const torch::Tensor delta = (d_out * o).sum(-1);  // Σ_j P_ij dP_ij = rowsum(dO ⊙ O)
    // The probabilities of a tile of queries against a key chunk, recomputed from the log-sum-exp, and
    // the scores' gradient dS = P ⊙ (dO Vᵀ − delta).
    auto tile_gradients = [&](const torch::Tensor& q_tile, const torch::Tensor& d_out_tile, const torch::Tensor& lse_tile,
                              const torch::Tensor& delta_tile, const torch::Tensor& keys, const torch::Tensor& values,
                              Visibility seen, int64_t first, const torch::Tensor& same) {
      torch::Tensor probs = torch::exp(scores(q_tile, keys, scale, seen, first, same) - lse_tile.unsqueeze(-1));
      torch::Tensor d_s = probs * (torch::matmul(d_out_tile, values.transpose(-2, -1)) - delta_tile.unsqueeze(-1));
      return std::make_pair(probs, d_s);
    };
    // Two passes, so that no gradient sum has to travel (memory per rank stays that of one extra chunk
    // in flight): first keys and values circulate and this rank's dQ accumulates, then queries circulate
    // with dO, lse and delta and this rank's dK and dV accumulate. The bytes on the wire are those of
    // one pass carrying dK and dV sums; the scores are computed twice.
    torch::Tensor d_q = torch::zeros_like(q);
    ring_pass({k, v}, group, false, [&](int owner, const Blocks& block) {
      const Visibility seen = visibility(causal, owner, r);
      if (seen == Visibility::kNone) return Blocks();
      for (int64_t first = 0; first < c; first += tile) {
        const int64_t rows = std::min(tile, c - first);
        const auto [probs, d_s] = tile_gradients(q.narrow(2, first, rows), d_out.narrow(2, first, rows),
                                                 lse.narrow(2, first, rows), delta.narrow(2, first, rows), block[0],
                                                 block[1], seen, first,
                                                 same_document(settings.documents, r, first, rows, owner, c));
        d_q.narrow(2, first, rows).add_(torch::matmul(d_s, block[0]), scale);
      }
      return Blocks();
    });
    torch::Tensor d_k = torch::zeros_like(k), d_v = torch::zeros_like(v);
    ring_pass({q, d_out.contiguous(), lse, delta}, group, false, [&](int owner, const Blocks& block) {
      const Visibility seen = visibility(causal, /*keys=*/r, /*queries=*/owner);
      if (seen == Visibility::kNone) return Blocks();
      for (int64_t first = 0; first < c; first += tile) {
        const int64_t rows = std::min(tile, c - first);
        const torch::Tensor q_tile = block[0].narrow(2, first, rows), d_out_tile = block[1].narrow(2, first, rows);
        const auto [probs, d_s] = tile_gradients(q_tile, d_out_tile, block[2].narrow(2, first, rows),
                                                 block[3].narrow(2, first, rows), k, v, seen, first,
                                                 same_document(settings.documents, owner, first, rows, r, c));
        d_v.add_(torch::matmul(probs.transpose(-2, -1), d_out_tile));
        d_k.add_(torch::matmul(d_s.transpose(-2, -1), q_tile), scale);
      }
      return Blocks();
    });
    return {d_q.to(settings.input_dtype), d_k.to(settings.input_dtype), d_v.to(settings.input_dtype), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

void check_documents(const torch::Tensor& q, const torch::Tensor& documents, int ranks) {
  KUAFU_CHECK(!documents.defined() || (documents.dim() == 2 && documents.size(0) == q.size(0) &&
                                       documents.size(1) == q.size(2) * ranks),
              "ring attention: documents must be [B, n] for the whole sequence (B = ", q.size(0), ", n = ",
              q.size(2) * ranks, "), got ", documents.sizes());
}

}  // namespace

torch::Tensor ring_self_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  dist::GroupPtr group, bool causal, const torch::Tensor& documents) {
  check_chunks(q, k, v, "ring_self_attention");
  check_documents(q, documents, group->size());
  return RingSelfAttention::apply(q, k, v, std::move(group), causal, Documents{documents});
}

torch::Tensor blockwise_ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       dist::GroupPtr group, bool causal, int64_t query_tile,
                                       const torch::Tensor& documents) {
  check_chunks(q, k, v, "blockwise_ring_attention");
  KUAFU_CHECK(query_tile > 0, "blockwise_ring_attention: query_tile must be positive, got ", query_tile);
  check_documents(q, documents, group->size());
  return BlockwiseRingAttention::apply(q, k, v, std::move(group), causal, query_tile, Documents{documents});
}

}  // namespace kuafu::parallel::sequence

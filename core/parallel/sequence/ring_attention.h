// Ring attention: the sequence is cut into P contiguous chunks, rank r of the group holding the
// queries, keys and values of positions [rC, (r+1)C). Key/value chunks travel round the ring (rank r
// sends to r+1 and receives from r-1), so in P steps every rank meets every chunk; in backward their
// gradients travel with them and arrive home after one more hop.
#pragma once

#include "core/dist/process_group.h"

namespace kuafu::parallel::sequence {

// Colossal-AI's ring self-attention (RSA): this rank's scores against the whole sequence,
// [B, H, C, n], are formed and kept for backward, so attention memory per rank grows as n²/P.
// q, k, v: [B, H, C, D], this rank's chunk. `causal`: position i sees positions <= i. `documents`
// (packed rows): [B, n] int64 for the whole sequence, each query seeing only keys of its own document;
// undefined: one document per row.
torch::Tensor ring_self_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  dist::GroupPtr group, bool causal, const torch::Tensor& documents = {});

// Blockwise ring attention: an online softmax over the chunks (and over tiles of `query_tile` query
// rows inside a chunk) keeps only q, k, v, the output and each row's log-sum-exp; backward recomputes
// the scores tile by tile. Attention memory per rank grows as n/P.
torch::Tensor blockwise_ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       dist::GroupPtr group, bool causal, int64_t query_tile = 64,
                                       const torch::Tensor& documents = {});

}  // namespace kuafu::parallel::sequence

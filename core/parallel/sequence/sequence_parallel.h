// Sequence parallelism: the ranks of the "sequence" mesh axis each hold one contiguous chunk of every
// sequence. Attention is the only layer that needs the other chunks: ring (keys and values circulate)
// or all-to-all (Ulysses: heads are exchanged for sequence before attention and back after).
#pragma once

#include <string>

#include "core/config/config.h"
#include "core/config/schema.h"
#include "core/dist/process_mesh.h"

namespace kuafu::parallel::sequence {

enum class SequenceMode {
  kNone,
  kRing,        // blockwise ring attention with an online softmax (memory n/P per rank)
  kRingScores,  // Colossal-AI's ring self-attention, full score rows kept (memory n²/P per rank)
  kAllToAll,    // Ulysses: all-to-all to head-split, local attention, all-to-all back
};

// parallel.sequence.mode and parallel.sequence.size.
void add_sequence_parallel_schema(config::Schema& schema);

struct SequenceParallel {
  SequenceMode mode = SequenceMode::kNone;
  int size = 1;
  dist::GroupPtr group;  // the "sequence" axis of the mesh (null when off)
  int64_t query_tile = 64;  // blockwise ring: query rows per score tile (a tile of scores ~ one head-dim slice of q)

  bool enabled() const { return mode != SequenceMode::kNone; }
  int rank() const { return group ? group->rank() : 0; }
};

// The mode and size from the config (the group is set once the mesh exists).
SequenceParallel sequence_parallel_spec(const config::Config& config);
SequenceMode sequence_mode(const std::string& name);  // "none", "ring", "ring_scores", "all_to_all"

// softmax(q kᵀ/√D) v over the whole sequence for this rank's chunk of queries. q, k, v: [B, H, C, D],
// this rank's chunk (serial attention when `sp` is off). All-to-all needs H to divide by the size;
// attention-probability dropout runs only where the whole key row is local (serial, all-to-all).
// `documents` (packed rows): [B, n] int64 for the whole sequence, every rank's copy; each query sees
// only keys of its own document.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                        double dropout, const SequenceParallel& sp, const torch::Tensor& documents = {});

// Ulysses attention on its own (the ring forms are in ring_attention.h).
torch::Tensor all_to_all_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   dist::GroupPtr group, bool causal, double dropout = 0.0,
                                   const torch::Tensor& documents = {});

// This rank's chunk of `x` along `dim` (no communication; inputs every rank already holds). The length
// must divide by the size: the error names both.
torch::Tensor local_chunk(const torch::Tensor& x, int64_t dim, const SequenceParallel& sp);
// The whole sequence from every rank's chunk (autograd: the backward keeps this rank's part of the
// summed gradient, i.e. a reduce-scatter).
torch::Tensor gather_chunks(const torch::Tensor& x, int64_t dim, const SequenceParallel& sp);

}  // namespace kuafu::parallel::sequence

// Cutting a model's ordered blocks into pipeline stages (or the p v virtual stages of the interleaved
// schedule). A partition is its boundaries b_0 = 0 < b_1 < ... < b_parts = blocks: part k owns blocks
// [b_k, b_(k+1)). No LibTorch here: costs are numbers (parameter counts, measured block times).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/parallel/pipeline/schedule.h"

namespace kuafu::parallel::pipeline {

// Equal block counts; when they do not divide, the later parts take one block more (the first part
// also holds the embeddings, the last the head).
std::vector<int> partition_uniform(int blocks, int parts);

// Contiguous parts minimising the largest part cost, every part at least one block; among those, the
// parts the maximum does not bind are kept balanced (smallest sum of squares, a tie-break). `first_extra`
// and `last_extra` are costs fixed on the first and last part (the embeddings, the head and loss), so
// the blocks are balanced around them. The maximum is exact (dynamic programming over the boundaries).
std::vector<int> partition_balanced(const std::vector<double>& costs, int parts, double first_extra = 0,
                                    double last_extra = 0);

// The cost of each part of `boundaries`, the extras included.
std::vector<double> part_costs(const std::vector<double>& costs, const std::vector<int>& boundaries,
                               double first_extra = 0, double last_extra = 0);

// The parts of a model (a head, blocks, a tail) one pipeline rank holds: the block ranges [begin, end)
// of its chunks (one per virtual stage, in chunk order), whether it runs the first virtual stage (the
// head) and the last (the tail and loss).
struct StagePlan {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  bool first = true;
  bool last = true;
  static StagePlan whole(int64_t blocks) { return {{{0, blocks}}, true, true}; }
  bool holds_block(int64_t i) const;
};

// What each part costs, for balancing: one block, and what the first stage (the head) and the last
// (the tail) carry besides their blocks. Parameters or measured seconds.
struct StageCosts {
  double block = 1, head = 0, tail = 0;
};

// Pipeline stage `stage`'s plan: the blocks cut into the schedule's p v virtual stages, chunk c holding
// virtual stage c p + stage; equal block counts, or balanced by `costs`.
StagePlan stage_plan(const ScheduleSpec& spec, int stage, int64_t blocks);
StagePlan stage_plan(const ScheduleSpec& spec, int stage, int64_t blocks, const StageCosts& costs);

}  // namespace kuafu::parallel::pipeline

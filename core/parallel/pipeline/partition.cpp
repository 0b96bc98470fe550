#include "core/parallel/pipeline/partition.h"

#include <algorithm>
#include <limits>

#include "core/util/error.h"

namespace kuafu::parallel::pipeline {
namespace {

void check_parts(int blocks, int parts) {
  KUAFU_CHECK(parts >= 1, "a model needs at least one pipeline stage, got ", parts);
  KUAFU_CHECK(blocks >= parts, "cannot cut ", blocks, " blocks into ", parts,
              " pipeline stages: every stage needs at least one block");
}

}  // namespace

std::vector<int> partition_uniform(int blocks, int parts) {
  check_parts(blocks, parts);
  std::vector<int> boundaries = {0};
  const int base = blocks / parts, longer = blocks % parts;  // the last `longer` parts get base + 1
  for (int k = 0; k < parts; ++k) boundaries.push_back(boundaries.back() + base + (k >= parts - longer ? 1 : 0));
  return boundaries;
}

std::vector<int> partition_balanced(const std::vector<double>& costs, int parts, double first_extra,
                                    double last_extra) {
  const int n = static_cast<int>(costs.size());
  check_parts(n, parts);
  for (size_t i = 0; i < costs.size(); ++i) {
    KUAFU_CHECK(costs[i] >= 0, "block ", i, " has a negative cost ", costs[i]);
  }
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // The cost of part k holding blocks [a, b).
  auto cost = [&](int k, int a, int b) {
    return prefix[b] - prefix[a] + (k == 0 ? first_extra : 0.0) + (k == parts - 1 ? last_extra : 0.0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][b]: the smallest largest cost of parts 0..k covering blocks [0, b), ties broken by the
  // smallest sum of squared part costs (so parts the maximum does not bind stay balanced too);
  // cut[k][b]: where part k starts in it.
  std::vector<std::vector<double>> best(parts, std::vector<double>(static_cast<size_t>(n) + 1, inf));
  std::vector<std::vector<double>> squares(parts, std::vector<double>(static_cast<size_t>(n) + 1, inf));
  std::vector<std::vector<int>> cut(parts, std::vector<int>(static_cast<size_t>(n) + 1, 0));
  for (int b = 1; b <= n; ++b) {
    best[0][b] = cost(0, 0, b);
    squares[0][b] = best[0][b] * best[0][b];
  }
  for (int k = 1; k < parts; ++k) {
    for (int b = k + 1; b <= n; ++b) {
      for (int a = k; a < b; ++a) {
        const double part = cost(k, a, b);
        const double worst = std::max(best[k - 1][a], part), square = squares[k - 1][a] + part * part;
        if (worst < best[k][b] || (worst == best[k][b] && square < squares[k][b])) {
          best[k][b] = worst;
          squares[k][b] = square;
          cut[k][b] = a;
        }
      }
    }
  }
  std::vector<int> boundaries(static_cast<size_t>(parts) + 1, 0);
  boundaries[parts] = n;
  for (int k = parts - 1; k >= 1; --k) boundaries[k] = cut[k][boundaries[k + 1]];
  return boundaries;
}

std::vector<double> part_costs(const std::vector<double>& costs, const std::vector<int>& boundaries,
                               double first_extra, double last_extra) {
  std::vector<double> out;
  const size_t parts = boundaries.size() - 1;
  for (size_t k = 0; k < parts; ++k) {
    double sum = (k == 0 ? first_extra : 0.0) + (k + 1 == parts ? last_extra : 0.0);
    for (int i = boundaries[k]; i < boundaries[k + 1]; ++i) sum += costs[static_cast<size_t>(i)];
    out.push_back(sum);
  }
  return out;
}

bool StagePlan::holds_block(int64_t i) const {
  for (const auto& [begin, end] : chunks) {
    if (begin <= i && i < end) return true;
  }
  return false;
}

namespace {

StagePlan plan_from_bounds(const ScheduleSpec& spec, int stage, const std::vector<int>& bounds) {
  StagePlan plan;
  for (int c = 0; c < spec.chunks; ++c) {
    const int v = c * spec.stages + stage;
    plan.chunks.emplace_back(bounds[v], bounds[v + 1]);
  }
  plan.first = stage == 0;
  plan.last = stage == spec.stages - 1;
  return plan;
}

}  // namespace

StagePlan stage_plan(const ScheduleSpec& spec, int stage, int64_t blocks) {
  return plan_from_bounds(spec, stage, partition_uniform(static_cast<int>(blocks), spec.virtual_stages()));
}

StagePlan stage_plan(const ScheduleSpec& spec, int stage, int64_t blocks, const StageCosts& costs) {
  const std::vector<double> per_block(static_cast<size_t>(blocks), costs.block);
  return plan_from_bounds(spec, stage, partition_balanced(per_block, spec.virtual_stages(), costs.head, costs.tail));
}

}  // namespace kuafu::parallel::pipeline

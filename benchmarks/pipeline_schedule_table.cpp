// The bubble (idle time / step time) and the live activations of each pipeline schedule when every
// stage takes the same time (backward = 2 x forward), by simulating the schedules' step lists across
// ranks, next to (p - 1) / (v m + p - 1). The schedule alone, before any real communication or
// imbalance: the floor a measured run is compared with.
// Usage: pipeline_schedule_table [stages = 4]
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/parallel/pipeline/schedule.h"

int main(int argc, char** argv) {
  using namespace kuafu::parallel::pipeline;
  const int p = argc > 1 ? std::atoi(argv[1]) : 4;
  std::printf("p = %d stages; bubble = idle / step time (worst stage); live = most micro-batch chunks alive on stage 0\n", p);
  std::printf("%-16s %-4s %-10s %-10s %-6s\n", "schedule", "m", "bubble", "formula", "live");
  for (const auto& [kind, chunks] : {std::pair{ScheduleKind::kGPipe, 1}, std::pair{ScheduleKind::k1F1B, 1},
                                     std::pair{ScheduleKind::kInterleaved, 2}}) {
    for (int m : {4, 8, 16}) {
      const ScheduleSpec spec{kind, p, m, chunks};
      // Per virtual stage: a chunk of an interleaved rank holds 1/v of the rank's blocks.
      const Simulation run = simulate(spec, 1.0 / chunks, 2.0 / chunks);
      double worst = 0;
      for (int s = 0; s < p; ++s) worst = std::max(worst, run.bubble(s));
      std::printf("%-16s %-4d %-10.4f %-10.4f %-6d\n",
                  (kind_name(kind) + (chunks > 1 ? " v=" + std::to_string(chunks) : "")).c_str(), m, worst,
                  theoretical_bubble(spec), run.ranks[0].peak_in_flight);
    }
  }
  return 0;
}

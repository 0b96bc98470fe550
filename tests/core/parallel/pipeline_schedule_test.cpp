// Pipeline schedules and stage partitions (no LibTorch): the step lists of small cases written out by
// hand; every schedule simulated across its ranks without deadlock, each micro-batch chunk forwarded
// and backwarded once; GPipe's and 1F1B's bubble equal to (p - 1) / (m + p - 1) and the interleaved
// one to (p - 1) / (v m + p - 1), to 1e-12 (double rounding), for unequal forward and backward times;
// live activations m for GPipe and p - s for 1F1B; balanced partitions against brute force.
#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "core/parallel/pipeline/partition.h"
#include "core/parallel/pipeline/schedule.h"
#include "tests/support/test_util.h"

namespace kuafu::parallel::pipeline {
namespace {

std::string steps_of(ScheduleKind kind, int stages, int micro, int stage, int chunks = 1) {
  return describe(schedule_for({kind, stages, micro, chunks}, stage));
}

TEST(PipelineScheduleTest, SmallSchedulesAreTheListsWorkedByHand) {
  EXPECT_EQ(steps_of(ScheduleKind::kGPipe, 2, 2, 0), "F0 sa0 F1 sa1 rg0 B0 rg1 B1");
  EXPECT_EQ(steps_of(ScheduleKind::kGPipe, 2, 2, 1), "ra0 F0 ra1 F1 B0 sg0 B1 sg1");
  // 1F1B, 2 stages, 3 micro-batches: stage 0 warms up with one forward, stage 1 with none.
  EXPECT_EQ(steps_of(ScheduleKind::k1F1B, 2, 3, 0), "F0 sa0 F1 sa1 rg0 B0 F2 sa2 rg1 B1 rg2 B2");
  EXPECT_EQ(steps_of(ScheduleKind::k1F1B, 2, 3, 1), "ra0 F0 B0 sg0 ra1 F1 B1 sg1 ra2 F2 B2 sg2");
  // Interleaved, 2 stages x 2 chunks, m = p: every forward first. Chunk 1 of stage 0 is virtual
  // stage 2, fed by stage 1's chunk 0; backwards run the chunks in reverse.
  EXPECT_EQ(steps_of(ScheduleKind::kInterleaved, 2, 2, 0, 2),
            "F0 sa0 F1 sa1 ra0.1 F0.1 sa0.1 ra1.1 F1.1 sa1.1 rg0.1 B0.1 sg0.1 rg1.1 B1.1 sg1.1 rg0 B0 rg1 B1");
  EXPECT_EQ(steps_of(ScheduleKind::kInterleaved, 2, 2, 1, 2),
            "ra0 F0 sa0 ra1 F1 sa1 ra0.1 F0.1 ra1.1 F1.1 B0.1 sg0.1 B1.1 sg1.1 rg0 B0 sg0 rg1 B1 sg1");
  // m = 4: stage 0 warms up with 2 (p - 1) + (v - 1) p = 4 forwards; its last warm-up exchange also
  // fetches the first backward's gradient (rg0.1), and each steady forward-backward pair ends in one
  // exchange that sends both results and receives what the next pair needs (Megatron-LM's batching).
  EXPECT_EQ(steps_of(ScheduleKind::kInterleaved, 2, 4, 0, 2),
            "F0 sa0 F1 sa1 ra0.1 F0.1 sa0.1 ra1.1 F1.1 sa1.1 rg0.1 F2 B0.1 sa2 sg0.1 rg1.1 F3 B1.1 sa3 sg1.1 ra2.1 rg0 "
            "F2.1 B0 sa2.1 ra3.1 rg1 F3.1 B1 sa3.1 rg2.1 B2.1 sg2.1 rg3.1 B3.1 sg3.1 rg2 B2 rg3 B3");
}

TEST(PipelineScheduleTest, EvaluationRunsForwardsOnlyInRoundsThroughTheChunks) {
  EXPECT_EQ(describe(forward_only_schedule({ScheduleKind::kInterleaved, 2, 2, 2}, 0)),
            "F0 sa0 F1 sa1 ra0.1 F0.1 sa0.1 ra1.1 F1.1 sa1.1");
  // One micro-batch: the round's missing micro-batch 1 leaves idle places ("-1"), which keep stage 0's
  // send of activation 0 apart from its receive of what chunk 1 needs.
  EXPECT_EQ(describe(forward_only_schedule({ScheduleKind::kInterleaved, 2, 1, 2}, 0)), "F0 sa0 -1 ra0.1 F0.1 sa0.1 -1.1");
  EXPECT_EQ(describe(forward_only_schedule({ScheduleKind::kInterleaved, 2, 1, 2}, 1)), "ra0 F0 sa0 -1 ra0.1 F0.1 -1.1");
  EXPECT_EQ(describe(forward_only_schedule({ScheduleKind::k1F1B, 2, 2, 1}, 1)), "ra0 F0 ra1 F1");
}

TEST(PipelineScheduleTest, GPipeAndOneForwardOneBackwardHaveTheTheoreticalBubble) {
  for (const ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int p : {2, 4}) {
      for (int m : {1, 4, 8, 16}) {
        const ScheduleSpec spec{kind, p, m, 1};
        const Simulation run = simulate(spec, 1.0, 2.0);
        SCOPED_TRACE(kind_name(kind) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        EXPECT_NEAR(run.step_time, 3.0 * (m + p - 1), 1e-12);
        for (int s = 0; s < p; ++s) {
          EXPECT_NEAR(run.bubble(s), theoretical_bubble(spec), 1e-12) << "stage " << s;
          // GPipe keeps every micro-batch alive; 1F1B at most p - s on stage s.
          const int live = kind == ScheduleKind::kGPipe ? m : std::min(p - s, m);
          EXPECT_EQ(run.ranks[static_cast<size_t>(s)].peak_in_flight, live) << "stage " << s;
        }
      }
    }
  }
}

TEST(PipelineScheduleTest, InterleavingShrinksTheBubble) {
  for (int p : {2, 4}) {
    for (int m : {4, 8, 16}) {
      const ScheduleSpec plain{ScheduleKind::k1F1B, p, m, 1};
      const ScheduleSpec spec{ScheduleKind::kInterleaved, p, m, 2};
      // Each chunk holds half the blocks: half the time per virtual stage.
      const Simulation run = simulate(spec, 0.5, 1.0);
      const Simulation base = simulate(plain, 1.0, 2.0);
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      for (int s = 0; s < p; ++s) {
        EXPECT_LT(run.bubble(s), base.bubble(s)) << "stage " << s;
        EXPECT_NEAR(run.bubble(s), theoretical_bubble(spec), 1e-12) << "stage " << s;
      }
    }
  }
}

// The engine matches messages by order (as NCCL does), so every schedule's sends and receives must
// pair up in order, and where a send waits for its receive (NCCL) no schedule may deadlock: interleaved
// 1F1B included (it batches its exchanges as Megatron-LM does), and evaluation's forwards.
TEST(PipelineScheduleTest, EveryScheduleSuitsOrderedExchanges) {
  int checked = 0;
  for (const ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 12; ++m) {
        for (int chunks : {1, 2, 3}) {
          const ScheduleSpec spec{kind, p, m, chunks};
          try {
            check_spec(spec);
          } catch (const Error&) {
            continue;  // not a schedule the engine would run
          }
          SCOPED_TRACE(kind_name(kind) + " p=" + std::to_string(p) + " m=" + std::to_string(m) + " v=" +
                       std::to_string(chunks));
          EXPECT_NO_THROW(check_ordered_exchanges(spec, /*sends_block=*/false));
          EXPECT_NO_THROW(check_ordered_exchanges(spec, /*sends_block=*/true));
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 150);
  // Evaluation runs any number of micro-batches.
  for (int p = 1; p <= 6; ++p) {
    for (int m = 1; m <= 13; ++m) {
      for (int chunks : {1, 2, 3}) {
        const ScheduleSpec spec{chunks == 1 ? ScheduleKind::k1F1B : ScheduleKind::kInterleaved, p, m, chunks};
        SCOPED_TRACE("forward only p=" + std::to_string(p) + " m=" + std::to_string(m) + " v=" + std::to_string(chunks));
        std::vector<std::vector<Step>> forward_only;
        for (int s = 0; s < p; ++s) forward_only.push_back(forward_only_schedule(spec, s));
        EXPECT_NO_THROW(check_ordered_exchanges(spec, forward_only, /*sends_block=*/true));
      }
    }
  }
}

// The interleaved lists before Megatron-LM's batching (each receive just before its compute step)
// deadlock on NCCL once there are more micro-batches than stages: the checker must see it.
TEST(PipelineScheduleTest, UnbatchedInterleavedListsDeadlockWhereSendsBlock) {
  const ScheduleSpec spec{ScheduleKind::kInterleaved, 2, 4, 2};
  std::vector<std::vector<Step>> lists;
  for (int s = 0; s < 2; ++s) {
    // The same forwards and backwards in the same order, each with its messages around it.
    std::vector<Step> unbatched;
    for (const Step& step : schedule_for(spec, s)) {
      const int v = step.chunk * 2 + s;
      if (step.action == Action::kForward) {
        if (v > 0) unbatched.push_back({Action::kRecvActivation, step.micro, step.chunk});
        unbatched.push_back(step);
        if (v < 3) unbatched.push_back({Action::kSendActivation, step.micro, step.chunk});
      } else if (step.action == Action::kBackward) {
        if (v < 3) unbatched.push_back({Action::kRecvGradient, step.micro, step.chunk});
        unbatched.push_back(step);
        if (v > 0) unbatched.push_back({Action::kSendGradient, step.micro, step.chunk});
      }
    }
    lists.push_back(unbatched);
  }
  EXPECT_NO_THROW(check_ordered_exchanges(spec, lists, /*sends_block=*/false));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { check_ordered_exchanges(spec, lists, true); }),
                                "deadlocks where a send waits for its receive"));
}

TEST(PipelineScheduleTest, OrderedExchangesCatchSwappedMessagesAndDeadlocks) {
  using testing::Contains;
  using testing::error_message;
  const ScheduleSpec spec{ScheduleKind::kGPipe, 2, 2, 1};
  std::vector<std::vector<Step>> lists{schedule_for(spec, 0), schedule_for(spec, 1)};
  // Stage 1 receives activation 1 before activation 0: with tags this worked, by order it does not.
  auto swapped = lists;
  std::swap(swapped[1][0], swapped[1][2]);  // ra1 F0 ra0 F1 ...
  EXPECT_TRUE(Contains(error_message([&] { check_ordered_exchanges(spec, swapped, /*sends_block=*/false); }),
                       "message 0 from stage 0 to stage 1 is the header of activation 0"));
  // Stage 0 waits for gradient 0 before sending activation 1, which stage 1 needs before it can
  // compute gradient 0 (GPipe's stage 1 forwards both micro-batches first): stuck on any backend.
  auto blocked = lists;
  blocked[0] = {{Action::kForward, 0}, {Action::kSendActivation, 0}, {Action::kRecvGradient, 0},
                {Action::kForward, 1}, {Action::kSendActivation, 1}, {Action::kBackward, 0},
                {Action::kRecvGradient, 1}, {Action::kBackward, 1}};
  EXPECT_TRUE(Contains(error_message([&] { check_ordered_exchanges(spec, blocked, /*sends_block=*/true); }), "deadlocks"));
  EXPECT_TRUE(Contains(error_message([&] { check_ordered_exchanges(spec, blocked, /*sends_block=*/false); }),
                       "stage 1 at receiving the header of activation 1"));
  // The engine sizes a received gradient by the chunk's output: it cannot come before the forward.
  auto early = lists;
  early[0] = {{Action::kRecvGradient, 0}, {Action::kForward, 0}, {Action::kSendActivation, 0},
              {Action::kForward, 1}, {Action::kSendActivation, 1}, {Action::kBackward, 0},
              {Action::kRecvGradient, 1}, {Action::kBackward, 1}};
  EXPECT_TRUE(Contains(error_message([&] { check_ordered_exchanges(spec, early, /*sends_block=*/false); }),
                       "stage 0: receives gradient 0 of chunk 0 before its forward"));
}

TEST(PipelineScheduleTest, SpecsThatCannotBeScheduledAreRefused) {
  using testing::Contains;
  using testing::error_message;
  EXPECT_TRUE(Contains(error_message([] { check_spec({ScheduleKind::kInterleaved, 4, 6, 2}); }),
                       "multiple of the pipeline stages (4)"));
  EXPECT_TRUE(Contains(error_message([] { check_spec({ScheduleKind::kInterleaved, 4, 8, 1}); }), "at least 2"));
  EXPECT_TRUE(Contains(error_message([] { check_spec({ScheduleKind::k1F1B, 4, 8, 2}); }), "interleaved"));
  EXPECT_TRUE(Contains(error_message([] { check_spec({ScheduleKind::kGPipe, 2, 0, 1}); }), "micro-batch"));
  EXPECT_TRUE(Contains(error_message([] { schedule_for({ScheduleKind::kGPipe, 2, 2, 1}, 2); }), "stage 2"));
  EXPECT_TRUE(Contains(error_message([] { schedule_kind("zero-bubble"); }), "gpipe, 1f1b or interleaved"));
}

TEST(PipelinePartitionTest, UniformGivesTheLaterStagesTheExtraBlocks) {
  EXPECT_EQ(partition_uniform(8, 4), (std::vector<int>{0, 2, 4, 6, 8}));
  EXPECT_EQ(partition_uniform(10, 4), (std::vector<int>{0, 2, 4, 7, 10}));
  EXPECT_TRUE(testing::Contains(testing::error_message([] { partition_uniform(3, 4); }), "at least one block"));
}

// The largest part cost of the best partition, by trying every set of boundaries.
double brute_force_best(const std::vector<double>& costs, int parts, double first, double last) {
  const int n = static_cast<int>(costs.size());
  double best = 1e300;
  std::vector<int> b(static_cast<size_t>(parts) + 1, 0);
  b[parts] = n;
  std::function<void(int, int)> choose = [&](int k, int start) {
    if (k == parts) {
      const auto c = part_costs(costs, b, first, last);
      best = std::min(best, *std::max_element(c.begin(), c.end()));
      return;
    }
    for (int a = start; a <= n - (parts - k); ++a) {
      b[k] = a;
      choose(k + 1, a + 1);
    }
  };
  choose(1, 1);
  return best;
}

TEST(PipelinePartitionTest, BalancedMatchesBruteForce) {
  // Worked by hand: [5, 1, 1, 1, 1, 1, 5] into 3 parts is {5}, {1 x 5}, {5}.
  EXPECT_EQ(partition_balanced({5, 1, 1, 1, 1, 1, 5}, 3), (std::vector<int>{0, 1, 6, 7}));
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> cost(0.1, 10.0);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 4 + trial % 6, parts = 1 + trial % 4;
    std::vector<double> costs(static_cast<size_t>(n));
    for (auto& c : costs) c = cost(rng);
    const double first = trial % 3 == 0 ? cost(rng) : 0, last = trial % 2 == 0 ? cost(rng) : 0;
    const auto boundaries = partition_balanced(costs, parts, first, last);
    ASSERT_EQ(boundaries.size(), static_cast<size_t>(parts) + 1);
    for (int k = 0; k < parts; ++k) EXPECT_LT(boundaries[k], boundaries[k + 1]) << "empty part " << k;
    const auto c = part_costs(costs, boundaries, first, last);
    EXPECT_DOUBLE_EQ(*std::max_element(c.begin(), c.end()), brute_force_best(costs, parts, first, last))
        << "trial " << trial;
  }
}

}  // namespace
}  // namespace kuafu::parallel::pipeline

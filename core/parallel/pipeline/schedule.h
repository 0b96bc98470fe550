// Pipeline schedules as plain lists of steps per rank: GPipe (fill-drain), 1F1B and interleaved 1F1B
// (several model chunks per rank). The executor runs a rank's list in order; the tests read the lists
// and simulate them across ranks (simulate below) to check dependencies, bubbles and live activations.
// No LibTorch here: a schedule is data.
#pragma once

#include <string>
#include <vector>

namespace kuafu::parallel::pipeline {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved };

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int stages = 1;         // p: pipeline ranks
  int micro_batches = 1;  // m
  int chunks = 1;         // v: model chunks per rank (interleaved only; 1 otherwise)
  int virtual_stages() const { return stages * chunks; }
};

// "gpipe", "1f1b" or "interleaved"; kuafu::Error naming the accepted names otherwise.
ScheduleKind schedule_kind(const std::string& name);
std::string kind_name(ScheduleKind kind);

// kuafu::Error when the spec cannot be scheduled: fewer than one stage or micro-batch, chunks > 1
// outside interleaved (or 1 inside it), interleaved with m not a multiple of p (each round of p
// micro-batches passes through every chunk).
void check_spec(const ScheduleSpec& spec);

// One step of a rank. Chunk c of rank s is virtual stage c p + s: the model's blocks are cut into
// p v consecutive virtual stages, handed round-robin to the ranks. Sends and receives move the
// activation (forward) or its gradient (backward) of micro-batch `micro` between virtual stages
// v and v + 1, which live on neighbouring ranks (s and s + 1 mod p).
enum class Action {
  kRecvActivation,  // from the previous virtual stage, before kForward
  kForward,
  kSendActivation,  // to the next virtual stage
  kRecvGradient,    // from the next virtual stage, before kBackward
  kBackward,
  kSendGradient,    // to the previous virtual stage
  kIdle,            // a slot of a micro-batch the round lacks (evaluation): keeps the exchanges around it apart
};

struct Step {
  Action action;
  int micro = 0;
  int chunk = 0;
  bool operator==(const Step& other) const {
    return action == other.action && micro == other.micro && chunk == other.chunk;
  }
};

// Sends and receives (the rest are forwards and backwards).
inline bool is_communication(Action action) {
  return action != Action::kForward && action != Action::kBackward && action != Action::kIdle;
}

// The steps of pipeline rank `stage` (0 .. p-1). Sends are posted without waiting (the executor keeps
// their buffers alive until the step ends); a receive waits for its data.
std::vector<Step> schedule_for(const ScheduleSpec& spec, int stage);

// Forwards only (evaluation), any number of micro-batches: rounds of p micro-batches through chunk 0,
// then chunk 1, ..., with the exchanges batched as in training; a last round of fewer than p keeps the
// missing micro-batches' places as idle steps, so that the exchanges still meet in step.
std::vector<Step> forward_only_schedule(const ScheduleSpec& spec, int stage);

// "F3" forward of micro-batch 3, "B3" backward, "sa3"/"ra3" send/receive activation, "sg3"/"rg3"
// send/receive gradient, "-3" idle; ".1" appended for chunk 1 (interleaved). Space-separated.
std::string describe(const std::vector<Step>& steps);

// Every rank's list run together with forward and backward taking `forward_time` and
// `backward_time` per virtual stage and communication taking none. kuafu::Error naming the stuck
// steps when the lists deadlock or a step's input never arrives.
struct RankTimeline {
  double busy = 0;         // time spent in forward and backward
  double finish = 0;       // when the rank's last step ends
  int peak_in_flight = 0;  // most micro-batch chunks forwarded but not yet backwarded (live activations)
};
struct Simulation {
  std::vector<RankTimeline> ranks;
  double step_time = 0;  // the latest finish
  // Idle time / step time of rank `stage` (the bubble).
  double bubble(int stage) const { return 1.0 - ranks[static_cast<size_t>(stage)].busy / step_time; }
};
Simulation simulate(const ScheduleSpec& spec, double forward_time, double backward_time);

// How the executor moves messages: each run of consecutive sends and receives in a rank's list is one
// exchange, posted as two groups, first the headers of its activations (sent and received: what the
// receiver allocates), then every payload, each group in the list's order; messages from one rank to
// another match by order alone, without tags (as NCCL matches them). kuafu::Error when a rank's
// messages to another differ in order from those posted to receive them there, when a gradient is
// received before its chunk's forward, or when the lists deadlock: a group completes once its receives
// have met their sends and, with `sends_block` (NCCL: a send completes only once its receive is posted),
// its sends their receives; Gloo's sends complete on their own.
void check_ordered_exchanges(const ScheduleSpec& spec, bool sends_block);
// The same for given lists, one per stage (tests feed broken ones).
void check_ordered_exchanges(const ScheduleSpec& spec, const std::vector<std::vector<Step>>& lists, bool sends_block);

// The bubble of a balanced pipeline in theory: (p - 1) / (v m + p - 1) (v = 1 for GPipe and 1F1B).
double theoretical_bubble(const ScheduleSpec& spec);

}  // namespace kuafu::parallel::pipeline

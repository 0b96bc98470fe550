#include "core/parallel/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "core/util/error.h"

namespace kuafu::parallel::pipeline {
namespace {

// Appends a forward of (micro, chunk) on `stage` with the receive before it and the send after it.
void add_forward(std::vector<Step>& steps, const ScheduleSpec& spec, int stage, int micro, int chunk) {
  const int v = chunk * spec.stages + stage;
  if (v > 0) steps.push_back({Action::kRecvActivation, micro, chunk});
  steps.push_back({Action::kForward, micro, chunk});
  if (v < spec.virtual_stages() - 1) steps.push_back({Action::kSendActivation, micro, chunk});
}

void add_backward(std::vector<Step>& steps, const ScheduleSpec& spec, int stage, int micro, int chunk) {
  const int v = chunk * spec.stages + stage;
  if (v < spec.virtual_stages() - 1) steps.push_back({Action::kRecvGradient, micro, chunk});
  steps.push_back({Action::kBackward, micro, chunk});
  if (v > 0) steps.push_back({Action::kSendGradient, micro, chunk});
}

// GPipe: every forward, then every backward.
std::vector<Step> gpipe(const ScheduleSpec& spec, int stage) {
  std::vector<Step> steps;
  for (int i = 0; i < spec.micro_batches; ++i) add_forward(steps, spec, stage, i, 0);
  for (int i = 0; i < spec.micro_batches; ++i) add_backward(steps, spec, stage, i, 0);
  return steps;
}

// 1F1B: stage s runs p - s - 1 warm-up forwards, then alternates one forward and one backward, then
// drains the remaining backwards. At most p - s micro-batches are alive at once on stage s.
std::vector<Step> one_forward_one_backward(const ScheduleSpec& spec, int stage) {
  const int m = spec.micro_batches;
  const int warmup = std::min(spec.stages - stage - 1, m);
  std::vector<Step> steps;
  for (int i = 0; i < warmup; ++i) add_forward(steps, spec, stage, i, 0);
  for (int i = 0; i < m - warmup; ++i) {
    add_forward(steps, spec, stage, warmup + i, 0);
    add_backward(steps, spec, stage, i, 0);
  }
  for (int i = m - warmup; i < m; ++i) add_backward(steps, spec, stage, i, 0);
  return steps;
}

// Interleaved 1F1B (Narayanan et al., Megatron-LM): the rank's forward step k works on micro-batch
// (k / (p v)) p + k mod p of chunk (k mod p v) / p, so rounds of p micro-batches pass through chunk
// 0, then chunk 1, ...; backward step k likewise, chunks in reverse. Warm-up: 2 (p - s - 1) + (v - 1) p
// forwards (all of them when m = p), then one forward and one backward at a time.
std::vector<Step> interleaved(const ScheduleSpec& spec, int stage) {
  const int p = spec.stages, v = spec.chunks, total = spec.micro_batches * v;
  auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto chunk = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  const int warmup = spec.micro_batches == p ? total : std::min(2 * (p - stage - 1) + (v - 1) * p, total);
  std::vector<Step> steps;
  for (int k = 0; k < warmup; ++k) add_forward(steps, spec, stage, micro(k), chunk(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    add_forward(steps, spec, stage, micro(warmup + k), chunk(warmup + k, true));
    add_backward(steps, spec, stage, micro(k), chunk(k, false));
  }
  for (int k = total - warmup; k < total; ++k) add_backward(steps, spec, stage, micro(k), chunk(k, false));
  return steps;
}

const char* token(Action action) {
  switch (action) {
    case Action::kRecvActivation: return "ra";
    case Action::kForward: return "F";
    case Action::kSendActivation: return "sa";
    case Action::kRecvGradient: return "rg";
    case Action::kBackward: return "B";
    case Action::kSendGradient: return "sg";
  }
  return "?";
}

}  // namespace

ScheduleKind schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved;
  fail("unknown pipeline schedule '" + name + "' (gpipe, 1f1b or interleaved)");
}

std::string kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved: return "interleaved";
  }
  return "?";
}

void check_spec(const ScheduleSpec& spec) {
  KUAFU_CHECK(spec.stages >= 1, "a pipeline needs at least one stage, got ", spec.stages);
  KUAFU_CHECK(spec.micro_batches >= 1, "a pipeline needs at least one micro-batch, got ", spec.micro_batches);
  if (spec.kind != ScheduleKind::kInterleaved) {
    KUAFU_CHECK(spec.chunks == 1, "the ", kind_name(spec.kind), " schedule runs one model chunk per rank, got ",
                spec.chunks, " (use interleaved for more)");
    return;
  }
  KUAFU_CHECK(spec.chunks >= 2, "the interleaved schedule needs at least 2 model chunks per rank, got ", spec.chunks);
  KUAFU_CHECK(spec.micro_batches % spec.stages == 0, "the interleaved schedule needs the micro-batches (",
              spec.micro_batches, ") to be a multiple of the pipeline stages (", spec.stages, ")");
}

std::vector<Step> schedule_for(const ScheduleSpec& spec, int stage) {
  check_spec(spec);
  KUAFU_CHECK(stage >= 0 && stage < spec.stages, "pipeline stage ", stage, " is outside 0 .. ", spec.stages - 1);
  switch (spec.kind) {
    case ScheduleKind::kGPipe: return gpipe(spec, stage);
    case ScheduleKind::k1F1B: return one_forward_one_backward(spec, stage);
    case ScheduleKind::kInterleaved: return interleaved(spec, stage);
  }
  return {};
}

std::vector<Step> forward_only_schedule(const ScheduleSpec& spec, int stage) {
  // Any number of micro-batches and chunks runs forward only.
  KUAFU_CHECK(spec.stages >= 1 && spec.micro_batches >= 1 && spec.chunks >= 1, "a pipeline needs at least one stage, "
              "micro-batch and chunk, got ", spec.stages, ", ", spec.micro_batches, " and ", spec.chunks);
  KUAFU_CHECK(stage >= 0 && stage < spec.stages, "pipeline stage ", stage, " is outside 0 .. ", spec.stages - 1);
  // (m, c) on stage s needs (m, c) from stage s - 1, or (m, c - 1) from stage p - 1: both come earlier
  // in this order on their own rank, so the lists cannot wait on each other in a cycle.
  std::vector<Step> steps;
  for (int m = 0; m < spec.micro_batches; ++m) {
    for (int c = 0; c < spec.chunks; ++c) add_forward(steps, spec, stage, m, c);
  }
  return steps;
}

std::string describe(const std::vector<Step>& steps) {
  std::ostringstream out;
  for (size_t i = 0; i < steps.size(); ++i) {
    out << (i ? " " : "") << token(steps[i].action) << steps[i].micro;
    if (steps[i].chunk > 0) out << "." << steps[i].chunk;
  }
  return out.str();
}

Simulation simulate(const ScheduleSpec& spec, double forward_time, double backward_time) {
  const int p = spec.stages, last = spec.virtual_stages() - 1;
  std::vector<std::vector<Step>> lists;
  for (int s = 0; s < p; ++s) lists.push_back(schedule_for(spec, s));

  // Data in flight: (is gradient, micro, receiving virtual stage) -> time it was sent.
  std::map<std::tuple<bool, int, int>, double> sent;
  // Per rank: (micro, chunk) received, forwarded, backwarded.
  std::vector<std::set<std::pair<int, int>>> received(p), gradient_in(p), forwarded(p), backwarded(p);
  std::vector<size_t> next(p, 0);
  std::vector<int> in_flight(p, 0);
  Simulation result;
  result.ranks.resize(static_cast<size_t>(p));

  // Runs rank s's next step if its inputs are there; false when it must wait.
  auto advance = [&](int s) {
    const Step& step = lists[s][next[s]];
    RankTimeline& rank = result.ranks[static_cast<size_t>(s)];
    const int v = step.chunk * p + s;
    const std::pair<int, int> key{step.micro, step.chunk};
    auto take = [&](bool gradient) {
      const auto found = sent.find({gradient, step.micro, v});
      if (found == sent.end()) return false;
      rank.finish = std::max(rank.finish, found->second);
      sent.erase(found);
      return true;
    };
    switch (step.action) {
      case Action::kRecvActivation:
        if (!take(false)) return false;
        received[s].insert(key);
        break;
      case Action::kRecvGradient:
        if (!take(true)) return false;
        gradient_in[s].insert(key);
        break;
      case Action::kForward:
        KUAFU_CHECK(v == 0 || received[s].count(key), "stage ", s, ": F", step.micro, " of chunk ", step.chunk,
                    " runs before its activation was received");
        rank.finish += forward_time;
        rank.busy += forward_time;
        forwarded[s].insert(key);
        rank.peak_in_flight = std::max(rank.peak_in_flight, ++in_flight[s]);
        break;
      case Action::kBackward:
        KUAFU_CHECK(forwarded[s].count(key) && (v == last || gradient_in[s].count(key)), "stage ", s, ": B",
                    step.micro, " of chunk ", step.chunk, " runs before its forward or its gradient");
        rank.finish += backward_time;
        rank.busy += backward_time;
        backwarded[s].insert(key);
        --in_flight[s];
        break;
      case Action::kSendActivation:
        KUAFU_CHECK(forwarded[s].count(key), "stage ", s, ": sends activation ", step.micro, " before computing it");
        sent[{false, step.micro, v + 1}] = rank.finish;
        break;
      case Action::kSendGradient:
        KUAFU_CHECK(backwarded[s].count(key), "stage ", s, ": sends gradient ", step.micro, " before computing it");
        sent[{true, step.micro, v - 1}] = rank.finish;
        break;
    }
    ++next[s];
    return true;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < lists[s].size() && advance(s)) progress = true;
    }
  }
  std::ostringstream stuck;
  for (int s = 0; s < p; ++s) {
    if (next[s] < lists[s].size()) stuck << " stage " << s << " at " << describe({lists[s][next[s]]}) << ";";
  }
  KUAFU_CHECK(stuck.str().empty(), kind_name(spec.kind), " schedule deadlocks:", stuck.str());
  const size_t expected = static_cast<size_t>(spec.micro_batches * spec.chunks);
  for (int s = 0; s < p; ++s) {
    KUAFU_CHECK(forwarded[s].size() == expected && backwarded[s].size() == expected, "stage ", s, " ran ",
                forwarded[s].size(), " forwards and ", backwarded[s].size(), " backwards instead of ", expected);
    result.step_time = std::max(result.step_time, result.ranks[static_cast<size_t>(s)].finish);
  }
  return result;
}

namespace {

// A message between ranks: activation or gradient, of `micro`, for virtual stage `to`.
using Message = std::tuple<bool, int, int>;

std::string describe(const Message& m) {
  return (std::get<0>(m) ? "gradient " : "activation ") + std::to_string(std::get<1>(m)) + " for virtual stage " +
         std::to_string(std::get<2>(m));
}

}  // namespace

void check_ordered_exchanges(const ScheduleSpec& spec, bool sends_block) {
  std::vector<std::vector<Step>> lists;
  for (int s = 0; s < spec.stages; ++s) lists.push_back(schedule_for(spec, s));
  check_ordered_exchanges(spec, lists, sends_block);
}

void check_ordered_exchanges(const ScheduleSpec& spec, const std::vector<std::vector<Step>>& lists, bool sends_block) {
  const int p = spec.stages;
  KUAFU_CHECK(static_cast<int>(lists.size()) == p, "check_ordered_exchanges: ", lists.size(), " lists for ", p,
              " stages");
  // What each step sends or receives: (peer, message), sends to the peer and receives from it.
  auto message_of = [&](int s, const Step& step) {
    const int v = step.chunk * p + s, next = (s + 1) % p, previous = (s + p - 1) % p;
    switch (step.action) {
      case Action::kSendActivation: return std::make_pair(next, Message{false, step.micro, v + 1});
      case Action::kRecvActivation: return std::make_pair(previous, Message{false, step.micro, v});
      case Action::kSendGradient: return std::make_pair(previous, Message{true, step.micro, v - 1});
      case Action::kRecvGradient: return std::make_pair(next, Message{true, step.micro, v});
      default: return std::make_pair(-1, Message{});
    }
  };
  auto is_send = [](const Step& step) {
    return step.action == Action::kSendActivation || step.action == Action::kSendGradient;
  };
  // The exchanges: [begin, end) runs of communication steps, and their shape.
  std::vector<std::vector<std::pair<size_t, size_t>>> exchanges(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    const auto& list = lists[static_cast<size_t>(s)];
    for (size_t i = 0; i < list.size();) {
      if (!is_communication(list[i].action)) { ++i; continue; }
      size_t j = i, sends = 0;
      while (j < list.size() && is_communication(list[j].action)) sends += is_send(list[j++]) ? 1 : 0;
      KUAFU_CHECK(sends <= 1 && j - i - sends <= 1, kind_name(spec.kind), " schedule, stage ", s,
                  ": the exchange ", describe(std::vector<Step>(list.begin() + static_cast<long>(i), list.begin() + static_cast<long>(j))),
                  " holds more than one send or one receive");
      exchanges[static_cast<size_t>(s)].push_back({i, j});
      i = j;
    }
  }
  // Order: rank a's sends to b, in a's order, are b's receives from a, in b's order.
  std::map<std::pair<int, int>, std::vector<Message>> sent, received;
  for (int s = 0; s < p; ++s) {
    for (const Step& step : lists[static_cast<size_t>(s)]) {
      if (!is_communication(step.action)) continue;
      const auto [peer, message] = message_of(s, step);
      (is_send(step) ? sent[{s, peer}] : received[{peer, s}]).push_back(message);
    }
  }
  for (const auto& [pair, messages] : sent) {
    const auto& got = received[pair];
    for (size_t k = 0; k < std::max(messages.size(), got.size()); ++k) {
      KUAFU_CHECK(k < messages.size() && k < got.size() && messages[k] == got[k], kind_name(spec.kind),
                  " schedule: message ", k, " from stage ", pair.first, " to stage ", pair.second, " is ",
                  k < messages.size() ? describe(messages[k]) : std::string("missing"), " but the receiver expects ",
                  k < got.size() ? describe(got[k]) : std::string("nothing"));
    }
  }
  for (const auto& [pair, got] : received) {
    KUAFU_CHECK(sent.count(pair), kind_name(spec.kind), " schedule: stage ", pair.second, " expects ", describe(got.front()),
                " from stage ", pair.first, ", which sends it nothing");
  }
  if (!sends_block) return;
  // Exchanges: a rank posts its next exchange when it reaches it and leaves it once every message in it
  // has been posted by the other side too (k-th send from a to b matches b's k-th receive from a).
  std::map<std::pair<int, int>, size_t> sends_posted, receives_posted;
  std::vector<size_t> next(static_cast<size_t>(p), 0);  // the next exchange of each rank
  std::vector<bool> posted(static_cast<size_t>(p), false);
  struct Posted {
    std::pair<int, int> pair;  // (sender, receiver)
    size_t index;              // the message's place in that pair's order
    bool send;
  };
  std::vector<std::vector<Posted>> waiting(static_cast<size_t>(p));
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto su = static_cast<size_t>(s);
      if (next[su] == exchanges[su].size()) continue;
      const auto [begin, end] = exchanges[su][next[su]];
      if (!posted[su]) {
        waiting[su].clear();
        for (size_t i = begin; i < end; ++i) {
          const Step& step = lists[su][i];
          const int peer = message_of(s, step).first;
          if (is_send(step)) {
            waiting[su].push_back({{s, peer}, sends_posted[{s, peer}]++, true});
          } else {
            waiting[su].push_back({{peer, s}, receives_posted[{peer, s}]++, false});
          }
        }
        posted[su] = progress = true;
      }
      bool done = true;
      for (const Posted& m : waiting[su]) {
        done = done && (m.send ? receives_posted[m.pair] > m.index : sends_posted[m.pair] > m.index);
      }
      if (done) {
        ++next[su];
        posted[su] = false;
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (int s = 0; s < p; ++s) {
    const auto su = static_cast<size_t>(s);
    if (next[su] < exchanges[su].size()) {
      const auto [begin, end] = exchanges[su][next[su]];
      stuck << " stage " << s << " at "
            << describe(std::vector<Step>(lists[su].begin() + static_cast<long>(begin), lists[su].begin() + static_cast<long>(end)))
            << ";";
    }
  }
  KUAFU_CHECK(stuck.str().empty(), kind_name(spec.kind), " schedule of ", p, " stages and ", spec.micro_batches,
              " micro-batches cannot run where a send waits for its receive (NCCL): it deadlocks with", stuck.str(),
              " use parallel.schedule = \"1f1b\"");
}

double theoretical_bubble(const ScheduleSpec& spec) {
  const double p = spec.stages, m = spec.micro_batches, v = spec.chunks;
  return (p - 1) / (v * m + p - 1);
}

}  // namespace kuafu::parallel::pipeline

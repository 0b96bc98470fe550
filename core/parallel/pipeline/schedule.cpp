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

// A micro-batch chunk: (micro, chunk).
using Item = std::pair<int, int>;

// The steps of rank `stage` for forwards in `forwards`' order and backwards in `backwards`' order, with
// `warmup` forwards first, then one forward and one backward at a time, then the remaining backwards.
// The messages are laid out as Megatron-LM batches them, so that no exchange waits on a later one of its
// peer where a send completes only once its receive is posted (NCCL): after each forward (warm-up),
// each forward-backward pair (steady state) and each backward (cool-down), one exchange sends what was
// just computed and receives the inputs of the next forward and the next backward.
std::vector<Step> batched_exchanges(const ScheduleSpec& spec, int stage, const std::vector<Item>& forwards,
                                    const std::vector<Item>& backwards, int warmup) {
  const int forward_count = static_cast<int>(forwards.size()), backward_count = static_cast<int>(backwards.size());
  const int last = spec.virtual_stages() - 1;
  auto virtual_stage = [&](const Item& item) { return item.second * spec.stages + stage; };
  auto missing = [&](const Item& item) { return item.first >= spec.micro_batches; };  // a padded round's place
  std::vector<Step> steps;
  // Sends forward `sent_forward`'s output and backward `sent_backward`'s input gradient, receives the
  // input of forward `next_forward` and the output gradient of backward `next_backward` (out of range: none).
  auto exchange = [&](int sent_forward, int sent_backward, int next_forward, int next_backward) {
    // Only messages that exist: the first virtual stage receives no activation and sends no gradient,
    // the last sends no activation and receives no gradient.
    auto add = [&](Action action, const std::vector<Item>& items, int k) {
      if (k < 0 || k >= static_cast<int>(items.size()) || missing(items[static_cast<size_t>(k)])) return;
      const Item& item = items[static_cast<size_t>(k)];
      const int v = virtual_stage(item);
      if ((action == Action::kSendActivation || action == Action::kRecvGradient) ? v < last : v > 0) {
        steps.push_back({action, item.first, item.second});
      }
    };
    add(Action::kSendActivation, forwards, sent_forward);
    add(Action::kSendGradient, backwards, sent_backward);
    add(Action::kRecvActivation, forwards, next_forward);
    add(Action::kRecvGradient, backwards, next_backward);
  };
  auto compute = [&](Action action, const Item& item) {
    steps.push_back({missing(item) ? Action::kIdle : action, item.first, item.second});
  };
  const bool steady = warmup < forward_count;
  exchange(-1, -1, 0, -1);
  for (int k = 0; k < warmup; ++k) {
    compute(Action::kForward, forwards[static_cast<size_t>(k)]);
    // The last warm-up exchange also fetches the first backward's gradient.
    exchange(k, -1, k + 1, k == warmup - 1 && steady ? 0 : -1);
  }
  for (int j = 0; j < forward_count - warmup; ++j) {
    compute(Action::kForward, forwards[static_cast<size_t>(warmup + j)]);
    compute(Action::kBackward, backwards[static_cast<size_t>(j)]);
    exchange(warmup + j, j, warmup + j + 1, j + 1);
  }
  if (!steady) exchange(-1, -1, -1, 0);
  for (int j = forward_count - warmup; j < backward_count; ++j) {
    compute(Action::kBackward, backwards[static_cast<size_t>(j)]);
    exchange(-1, j, -1, j + 1);
  }
  return steps;
}

// Rounds of p micro-batches, each round through chunk 0, then chunk 1, ... (chunks reversed when
// `reversed`, for backwards). A last round of fewer than p micro-batches is padded with micro-batches
// m, m + 1, ... that batched_exchanges leaves idle.
std::vector<Item> rounds_through_chunks(const ScheduleSpec& spec, bool reversed) {
  std::vector<Item> items;
  for (int first = 0; first < spec.micro_batches; first += spec.stages) {
    for (int c = 0; c < spec.chunks; ++c) {
      const int chunk = reversed ? spec.chunks - 1 - c : c;
      for (int m = first; m < first + spec.stages; ++m) items.push_back({m, chunk});
    }
  }
  return items;
}

// Interleaved 1F1B (Narayanan et al., Megatron-LM): rounds of p micro-batches pass through chunk 0,
// then chunk 1, ...; backwards likewise, chunks in reverse. Warm-up: 2 (p - s - 1) + (v - 1) p forwards
// (all of them when m = p), then one forward and one backward at a time.
std::vector<Step> interleaved(const ScheduleSpec& spec, int stage) {
  const int p = spec.stages, total = spec.micro_batches * spec.chunks;
  const int warmup = spec.micro_batches == p ? total : std::min(2 * (p - stage - 1) + (spec.chunks - 1) * p, total);
  return batched_exchanges(spec, stage, rounds_through_chunks(spec, false), rounds_through_chunks(spec, true), warmup);
}

const char* token(Action action) {
  switch (action) {
    case Action::kRecvActivation: return "ra";
    case Action::kForward: return "F";
    case Action::kSendActivation: return "sa";
    case Action::kRecvGradient: return "rg";
    case Action::kBackward: return "B";
    case Action::kSendGradient: return "sg";
    case Action::kIdle: return "-";
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
  KUAFU_CHECK(spec.stages >= 1 && spec.micro_batches >= 1 && spec.chunks >= 1, "a pipeline needs at least one stage, "
              "micro-batch and chunk, got ", spec.stages, ", ", spec.micro_batches, " and ", spec.chunks);
  KUAFU_CHECK(stage >= 0 && stage < spec.stages, "pipeline stage ", stage, " is outside 0 .. ", spec.stages - 1);
  // Rounds of p micro-batches through the chunks, each exchange batched as in training.
  const std::vector<Item> items = rounds_through_chunks(spec, false);
  return batched_exchanges(spec, stage, items, {}, static_cast<int>(items.size()));
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
      case Action::kIdle:
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

// What moves from one rank to another: the header or the payload of an activation, or a gradient, of
// micro-batch `micro` for virtual stage `to`.
struct Message {
  bool gradient = false;
  bool header = false;
  int micro = 0;
  int to = 0;
  bool operator==(const Message& o) const {
    return gradient == o.gradient && header == o.header && micro == o.micro && to == o.to;
  }
};

std::string describe(const Message& m) {
  return std::string(m.header ? "the header of " : "") + (m.gradient ? "gradient " : "activation ") +
         std::to_string(m.micro) + " for virtual stage " + std::to_string(m.to);
}

// One message a rank posts: a send to `peer` or a receive from it.
struct Posting {
  int peer = 0;
  bool send = false;
  Message message;
};

// The groups of messages rank `s` posts, in order, as the engine posts them: for each exchange (a run of
// consecutive sends and receives) first the headers of its activations, sent and received, then every
// payload, each group in the list's order. A group completes before the next is posted.
std::vector<std::vector<Posting>> posting_groups(const ScheduleSpec& spec, int s, const std::vector<Step>& list) {
  const int p = spec.stages, next = (s + 1) % p, previous = (s + p - 1) % p;
  auto posting = [&](const Step& step, bool header) {
    const int v = step.chunk * p + s;
    switch (step.action) {
      case Action::kSendActivation: return Posting{next, true, {false, header, step.micro, v + 1}};
      case Action::kRecvActivation: return Posting{previous, false, {false, header, step.micro, v}};
      case Action::kSendGradient: return Posting{previous, true, {true, false, step.micro, v - 1}};
      default: return Posting{next, false, {true, false, step.micro, v}};  // kRecvGradient
    }
  };
  std::vector<std::vector<Posting>> groups;
  for (size_t i = 0; i < list.size();) {
    if (!is_communication(list[i].action)) {
      ++i;
      continue;
    }
    std::vector<Posting> headers, payloads;
    for (; i < list.size() && is_communication(list[i].action); ++i) {
      const Action a = list[i].action;
      if (a == Action::kSendActivation || a == Action::kRecvActivation) headers.push_back(posting(list[i], true));
      payloads.push_back(posting(list[i], false));
    }
    if (!headers.empty()) groups.push_back(headers);
    groups.push_back(payloads);
  }
  return groups;
}

// kuafu::Error when a gradient is received for a micro-batch chunk not yet forwarded (the engine sizes
// the gradient by the chunk's output).
void check_gradients_follow_forwards(const ScheduleSpec& spec, int s, const std::vector<Step>& list) {
  std::set<std::pair<int, int>> forwarded;
  for (const Step& step : list) {
    if (step.action == Action::kForward) forwarded.insert({step.micro, step.chunk});
    KUAFU_CHECK(step.action != Action::kRecvGradient || forwarded.count({step.micro, step.chunk}),
                kind_name(spec.kind), " schedule, stage ", s, ": receives gradient ", step.micro, " of chunk ",
                step.chunk, " before its forward");
  }
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
  std::vector<std::vector<std::vector<Posting>>> groups;
  for (int s = 0; s < p; ++s) {
    check_gradients_follow_forwards(spec, s, lists[static_cast<size_t>(s)]);
    groups.push_back(posting_groups(spec, s, lists[static_cast<size_t>(s)]));
  }
  // Order: what rank a sends to b, in a's order, is what b receives from a, in b's order.
  std::map<std::pair<int, int>, std::vector<Message>> sent, received;
  for (int s = 0; s < p; ++s) {
    for (const auto& group : groups[static_cast<size_t>(s)]) {
      for (const Posting& m : group) (m.send ? sent[{s, m.peer}] : received[{m.peer, s}]).push_back(m.message);
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
    KUAFU_CHECK(sent.count(pair), kind_name(spec.kind), " schedule: stage ", pair.second, " expects ",
                describe(got.front()), " from stage ", pair.first, ", which sends it nothing");
  }
  // The ranks run together: a rank posts its next group and leaves it once every receive in it has met its
  // send (the k-th send from a to b meets b's k-th receive from a) and, where sends block (NCCL), every
  // send has met its receive; Gloo's sends complete on their own.
  std::map<std::pair<int, int>, size_t> sends_posted, receives_posted;
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<std::vector<std::pair<size_t, Posting>>> waiting(static_cast<size_t>(p));  // (index in pair, message)
  std::vector<bool> posted(static_cast<size_t>(p), false);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto su = static_cast<size_t>(s);
      if (next[su] == groups[su].size()) continue;
      if (!posted[su]) {
        waiting[su].clear();
        for (const Posting& m : groups[su][next[su]]) {
          const std::pair<int, int> pair = m.send ? std::make_pair(s, m.peer) : std::make_pair(m.peer, s);
          waiting[su].push_back({(m.send ? sends_posted : receives_posted)[pair]++, m});
        }
        posted[su] = progress = true;
      }
      bool done = true;
      for (const auto& [index, m] : waiting[su]) {
        if (m.send && !sends_block) continue;
        const std::pair<int, int> pair = m.send ? std::make_pair(s, m.peer) : std::make_pair(m.peer, s);
        done = done && (m.send ? receives_posted[pair] : sends_posted[pair]) > index;
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
    if (next[su] == groups[su].size()) continue;
    stuck << " stage " << s << " at";
    for (const Posting& m : groups[su][next[su]]) {
      stuck << (m.send ? " sending " : " receiving ") << describe(m.message) << (m.send ? " to " : " from ")
            << "stage " << m.peer << ",";
    }
    stuck << ";";
  }
  KUAFU_CHECK(stuck.str().empty(), kind_name(spec.kind), " schedule of ", p, " stages and ", spec.micro_batches,
              " micro-batches deadlocks", sends_block ? " where a send waits for its receive (NCCL)" : "", ":",
              stuck.str());
}

double theoretical_bubble(const ScheduleSpec& spec) {
  const double p = spec.stages, m = spec.micro_batches, v = spec.chunks;
  return (p - 1) / (v * m + p - 1);
}

}  // namespace kuafu::parallel::pipeline

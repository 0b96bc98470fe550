#include "core/parallel/pipeline/engine.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/dist/collectives.h"
#include "core/util/error.h"

namespace kuafu::parallel::pipeline {
namespace {

constexpr int kMaxDims = 8;  // activations of up to 8 dimensions

// [dtype, dims, size_0, ..., size_7]: what the receiver allocates.
// Built on the host, sent from the group's device (NCCL moves GPU tensors only).
torch::Tensor header_of(const torch::Tensor& t, const torch::Device& device) {
  KUAFU_CHECK(t.dim() <= kMaxDims, "pipeline activations have at most ", kMaxDims, " dimensions, got ", t.sizes());
  std::vector<int64_t> header(2 + kMaxDims, 0);
  header[0] = static_cast<int64_t>(t.scalar_type());
  header[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) header[static_cast<size_t>(2 + d)] = t.size(d);
  return torch::tensor(header, torch::TensorOptions(torch::kInt64).device(device));
}

torch::Tensor empty_from_header(const torch::Tensor& received, const torch::Device& device) {
  const torch::Tensor header = received.cpu();
  const auto dims = header[1].item<int64_t>();
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < dims; ++d) sizes.push_back(header[2 + d].item<int64_t>());
  const auto dtype = static_cast<torch::ScalarType>(header[0].item<int64_t>());
  return torch::empty(sizes, torch::TensorOptions().dtype(dtype).device(device));
}

// What a micro-batch chunk keeps between its forward and its backward.
struct InFlight {
  torch::Tensor input;     // received activation (requires grad), or the micro-batch at virtual stage 0
  torch::Tensor output;    // activation, or the scaled loss at the last virtual stage
  torch::Tensor gradient;  // of the output, received from the next virtual stage
};

}  // namespace

PipelineEngine::PipelineEngine(const ScheduleSpec& spec, dist::GroupPtr group)
    : spec_(spec), group_(std::move(group)) {
  KUAFU_CHECK(group_ && group_->size() == spec.stages, "pipeline of ", spec.stages, " stages needs a group of ",
              spec.stages, " ranks, got ", group_ ? group_->size() : 0);
  // The training schedule is checked and made on the first run (an engine may only evaluate).
}

double PipelineEngine::run(const ChunkForward& forward, const std::function<torch::Tensor(int micro)>& micro_input,
                           double loss_scale, const std::function<void()>& after_backward) {
  if (steps_.empty()) {
    // What the lists must satisfy for messages matched by order, and on NCCL, where a send waits for its
    // receive, for exchanges not to deadlock: checked once, before computing.
    check_ordered_exchanges(spec_, /*sends_block=*/group_->kind() == dist::BackendKind::kNccl);
    steps_ = schedule_for(spec_, group_->rank());
  }
  return execute(steps_, forward, micro_input, loss_scale, /*width=*/1, after_backward).item<double>() /
         spec_.micro_batches;
}

double PipelineEngine::evaluate(const ChunkForward& forward,
                                const std::function<torch::Tensor(int micro)>& micro_input) {
  return evaluate_sums(forward, micro_input, /*width=*/1).item<double>() / spec_.micro_batches;
}

torch::Tensor PipelineEngine::evaluate_sums(const ChunkForward& forward,
                                            const std::function<torch::Tensor(int micro)>& micro_input, int64_t width) {
  torch::NoGradGuard no_grad;
  return execute(forward_only_schedule(spec_, group_->rank()), forward, micro_input, 1.0, width);
}

torch::Tensor PipelineEngine::execute(const std::vector<Step>& steps, const ChunkForward& forward,
                                      const std::function<torch::Tensor(int micro)>& micro_input, double loss_scale,
                                      int64_t width, const std::function<void()>& after_backward) {
  const int p = spec_.stages, s = group_->rank(), last = spec_.virtual_stages() - 1;
  const int next = (s + 1) % p, previous = (s + p - 1) % p;
  const double micro_batches = spec_.micro_batches;
  const torch::Device device = group_->device();
  const bool training = torch::GradMode::is_enabled();
  std::map<std::pair<int, int>, InFlight> live;  // by (micro, chunk)
  std::vector<dist::PendingSend> sends;           // Gloo: sends still in flight (NCCL completes them in exchange)
  torch::Tensor sums = torch::zeros({width}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  stats_ = RunStats();
  const auto start = Clock::now();
  int live_chunks = 0;

  // One exchange: a run of consecutive sends and receives, posted as check_ordered_exchanges models it:
  // first the headers of the activations sent and received (the receiver allocates from them), then
  // every payload, each group in the list's order.
  auto exchange = [&](std::vector<Step>::const_iterator begin, std::vector<Step>::const_iterator end) {
    // Sends already delivered free their buffers now rather than at the end of the step.
    sends.erase(std::remove_if(sends.begin(), sends.end(),
                               [](dist::PendingSend& send) {
                                 if (!send.completed()) return false;
                                 send.wait();
                                 return true;
                               }),
                sends.end());
    std::vector<dist::Message> headers;
    std::map<const Step*, torch::Tensor> header_of_step;  // activations received: their header buffers
    for (auto it = begin; it != end; ++it) {
      if (it->action == Action::kSendActivation) {
        headers.push_back({header_of(live[{it->micro, it->chunk}].output, device), next, /*send=*/true});
      } else if (it->action == Action::kRecvActivation) {
        torch::Tensor header = torch::empty({2 + kMaxDims}, torch::TensorOptions(torch::kInt64).device(device));
        headers.push_back({header, previous, /*send=*/false});
        header_of_step[&*it] = header;
      }
    }
    auto keep = [&](std::vector<dist::PendingSend> pending) {
      for (auto& send : pending) sends.push_back(std::move(send));
    };
    if (!headers.empty()) keep(dist::exchange(headers, *group_));
    std::vector<dist::Message> payloads;
    std::vector<torch::Tensor> activations_in;  // received activations: gradients flow back from them
    std::vector<std::pair<int, int>> done;      // slots nothing needs after the exchange
    for (auto it = begin; it != end; ++it) {
      const Step& step = *it;
      const int v = step.chunk * p + s;
      InFlight& slot = live[{step.micro, step.chunk}];
      switch (step.action) {
        case Action::kRecvActivation:
          slot.input = empty_from_header(header_of_step.at(&*it), device);
          payloads.push_back({slot.input, previous, /*send=*/false});
          activations_in.push_back(slot.input);
          break;
        case Action::kSendActivation:
          payloads.push_back({slot.output.detach(), next, /*send=*/true});
          if (!training) {  // evaluation: the message keeps what it needs
            done.push_back({step.micro, step.chunk});
            --live_chunks;
          }
          break;
        case Action::kRecvGradient:
          slot.gradient = torch::empty_like(slot.output);
          payloads.push_back({slot.gradient, next, /*send=*/false});
          break;
        case Action::kSendGradient:
          KUAFU_CHECK(slot.input.grad().defined(), "pipeline virtual stage ", v, ": the input activation of micro-batch ",
                      step.micro, " got no gradient (does the stage use its input?)");
          payloads.push_back({slot.input.grad(), previous, /*send=*/true});
          done.push_back({step.micro, step.chunk});
          break;
        default:
          fail("pipeline exchange given a compute step");
      }
    }
    keep(dist::exchange(payloads, *group_));
    for (torch::Tensor& input : activations_in) {
      if (input.is_floating_point() && training) input.requires_grad_(true);
    }
    for (const auto& key : done) live.erase(key);
  };

  for (auto it = steps.begin(); it != steps.end();) {
    if (is_communication(it->action)) {
      auto end = it;
      while (end != steps.end() && is_communication(end->action)) ++end;
      exchange(it, end);
      it = end;
      continue;
    }
    const Step& step = *it++;
    if (step.action == Action::kIdle) continue;
    const auto step_start = Clock::now();
    const int v = step.chunk * p + s;
    InFlight& slot = live[{step.micro, step.chunk}];
    if (step.action == Action::kForward) {
      if (v == 0) slot.input = micro_input(step.micro);
      slot.output = forward(step.chunk, slot.input, step.micro);
      if (v == last) {
        KUAFU_CHECK(slot.output.numel() == width, "the last pipeline stage must return ",
                    width == 1 ? std::string("a scalar loss") : std::to_string(width) + " numbers", ", got ",
                    slot.output.sizes());
        sums += slot.output.detach().to(torch::kFloat64).reshape({width});
        // The step's loss is the mean over micro-batches (scaled up for mixed precision).
        slot.output = slot.output * (loss_scale / micro_batches);
      }
      stats_.compute_seconds += seconds_since(step_start);
      stats_.peak_live = std::max(stats_.peak_live, ++live_chunks);
      if (!training && v == last) {  // evaluation: nothing waits for a backward
        live.erase({step.micro, step.chunk});
        --live_chunks;
      }
    } else {  // backward
      if (v == last) {
        slot.output.backward();
      } else {
        torch::autograd::backward({slot.output}, {slot.gradient});
      }
      if (after_backward) after_backward();
      slot.output = slot.gradient = torch::Tensor();
      if (v == 0) live.erase({step.micro, step.chunk});  // nothing to send back
      stats_.compute_seconds += seconds_since(step_start);
      --live_chunks;
    }
  }
  for (auto& send : sends) send.wait();
  stats_.step_seconds = seconds_since(start);
  // The last stage knows the loss; every stage reports it.
  dist::broadcast(sums, *group_, /*root=*/p - 1);  // virtual stage p v - 1 lives on stage p - 1
  return sums;
}

dist::GroupPtr first_and_last_stage_group(const dist::ProcessMesh& mesh) {
  int axis = -1;
  for (size_t i = 0; i < mesh.axes().size(); ++i) {
    if (mesh.axes()[i].name == "pipeline") axis = static_cast<int>(i);
  }
  if (axis < 0) return nullptr;
  const int p = mesh.size("pipeline"), s = mesh.coordinate("pipeline");
  if (p == 1 || (s != 0 && s != p - 1)) return nullptr;
  std::vector<int> coordinates;
  for (const auto& a : mesh.axes()) coordinates.push_back(mesh.coordinate(a.name));
  std::vector<int> members;
  for (int stage : {0, p - 1}) {
    coordinates[static_cast<size_t>(axis)] = stage;
    members.push_back(mesh.rank_at(coordinates));
  }
  return mesh.world_ptr()->new_group(
      "pipeline_ends_" + std::to_string(members[0]) + "_" + std::to_string(members[1]), members);
}

}  // namespace kuafu::parallel::pipeline

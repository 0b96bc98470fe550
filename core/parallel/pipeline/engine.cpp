#include "core/parallel/pipeline/engine.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/dist/collectives.h"
#include "core/util/error.h"

namespace kuafu::parallel::pipeline {
namespace {

constexpr int kMaxDims = 8;  // activations of up to 8 dimensions

// Message tags: unique per (micro-batch, receiving virtual stage, kind), so a receive matches its
// send whatever order the two ranks post them in.
enum Kind { kHeader = 0, kActivation = 1, kGradient = 2 };
int tag_of(int micro, int receiving_stage, int virtual_stages, Kind kind) {
  return 4 * (micro * virtual_stages + receiving_stage) + kind;
}

// [dtype, dims, size_0, ..., size_7]: what the receiver allocates.
torch::Tensor header_of(const torch::Tensor& t) {
  KUAFU_CHECK(t.dim() <= kMaxDims, "pipeline activations have at most ", kMaxDims, " dimensions, got ", t.sizes());
  torch::Tensor header = torch::zeros({2 + kMaxDims}, torch::kInt64);
  header[0] = static_cast<int64_t>(t.scalar_type());
  header[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) header[2 + d] = t.size(d);
  return header;
}

torch::Tensor empty_from_header(const torch::Tensor& header, const torch::Device& device) {
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
                           double loss_scale) {
  if (steps_.empty()) steps_ = schedule_for(spec_, group_->rank());
  return execute(steps_, forward, micro_input, loss_scale);
}

double PipelineEngine::evaluate(const ChunkForward& forward,
                                const std::function<torch::Tensor(int micro)>& micro_input) {
  torch::NoGradGuard no_grad;
  return execute(forward_only_schedule(spec_, group_->rank()), forward, micro_input, 1.0);
}

double PipelineEngine::execute(const std::vector<Step>& steps, const ChunkForward& forward,
                               const std::function<torch::Tensor(int micro)>& micro_input, double loss_scale) {
  const int p = spec_.stages, s = group_->rank(), last = spec_.virtual_stages() - 1;
  const int next = (s + 1) % p, previous = (s + p - 1) % p;
  const double micro_batches = spec_.micro_batches;
  const torch::Device device = group_->device();
  std::map<std::pair<int, int>, InFlight> live;  // by (micro, chunk)
  std::vector<dist::PendingSend> sends;
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  stats_ = RunStats();
  const auto start = Clock::now();
  int live_chunks = 0;

  for (const Step& step : steps) {
    const auto step_start = Clock::now();
    const int v = step.chunk * p + s;
    InFlight& slot = live[{step.micro, step.chunk}];
    // Sends already delivered free their buffers now rather than at the end of the step.
    sends.erase(std::remove_if(sends.begin(), sends.end(),
                               [](dist::PendingSend& send) {
                                 if (!send.completed()) return false;
                                 send.wait();
                                 return true;
                               }),
                sends.end());
    switch (step.action) {
      case Action::kRecvActivation: {
        torch::Tensor header = torch::empty({2 + kMaxDims}, torch::kInt64);
        dist::recv(header, *group_, previous, tag_of(step.micro, v, last + 1, kHeader));
        slot.input = empty_from_header(header, device);
        dist::recv(slot.input, *group_, previous, tag_of(step.micro, v, last + 1, kActivation));
        if (slot.input.is_floating_point() && torch::GradMode::is_enabled()) slot.input.requires_grad_(true);
        break;
      }
      case Action::kForward: {
        if (v == 0) slot.input = micro_input(step.micro);
        slot.output = forward(step.chunk, slot.input, step.micro);
        if (v == last) {
          KUAFU_CHECK(slot.output.numel() == 1, "the last pipeline stage must return a scalar loss, got ",
                      slot.output.sizes());
          loss_sum += slot.output.detach().to(torch::kFloat64).reshape({});
          // The step's loss is the mean over micro-batches (scaled up for mixed precision).
          slot.output = slot.output * (loss_scale / micro_batches);
        }
        stats_.compute_seconds += seconds_since(step_start);
        stats_.peak_live = std::max(stats_.peak_live, ++live_chunks);
        if (!torch::GradMode::is_enabled() && v == last) {  // evaluation: nothing waits for a backward
          live.erase({step.micro, step.chunk});
          --live_chunks;
        }
        break;
      }
      case Action::kSendActivation: {
        const torch::Tensor activation = slot.output.detach();
        sends.push_back(dist::send_async(header_of(activation), *group_, next, tag_of(step.micro, v + 1, last + 1, kHeader)));
        sends.push_back(dist::send_async(activation, *group_, next, tag_of(step.micro, v + 1, last + 1, kActivation)));
        if (!torch::GradMode::is_enabled()) {  // evaluation: the pending send keeps what it needs
          live.erase({step.micro, step.chunk});
          --live_chunks;
        }
        break;
      }
      case Action::kRecvGradient:
        slot.gradient = torch::empty_like(slot.output);
        dist::recv(slot.gradient, *group_, next, tag_of(step.micro, v, last + 1, kGradient));
        break;
      case Action::kBackward:
        if (v == last) {
          slot.output.backward();
        } else {
          torch::autograd::backward({slot.output}, {slot.gradient});
        }
        slot.output = slot.gradient = torch::Tensor();
        if (v == 0) live.erase({step.micro, step.chunk});  // nothing to send back
        stats_.compute_seconds += seconds_since(step_start);
        --live_chunks;
        break;
      case Action::kSendGradient: {
        KUAFU_CHECK(slot.input.grad().defined(), "pipeline virtual stage ", v, ": the input activation of micro-batch ",
                    step.micro, " got no gradient (does the stage use its input?)");
        sends.push_back(dist::send_async(slot.input.grad(), *group_, previous, tag_of(step.micro, v - 1, last + 1, kGradient)));
        live.erase({step.micro, step.chunk});
        break;
      }
    }
  }
  for (auto& send : sends) send.wait();
  stats_.step_seconds = seconds_since(start);
  // The last stage knows the loss; every stage reports it.
  dist::broadcast(loss_sum, *group_, /*root=*/p - 1);  // virtual stage p v - 1 lives on stage p - 1
  return loss_sum.item<double>() / micro_batches;
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

#include "core/nn/fixed_shape_decoding.h"

#include <functional>

#include "core/util/error.h"

#ifdef KUAFU_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace kuafu::nn {

#ifdef KUAFU_WITH_CUDA
class StepGraph {
 public:
  // Runs `step` once for real on a side stream (which also warms up what the first call of each kernel sets
  // up: cuBLAS handles and workspaces), then captures it there; returns the real run's result. Capture
  // needs a stream other than the default one, and the replays run on the stream current at the time.
  // The step must not read a tensor's value on the host (.item(), a copy to the CPU): capture refuses it.
  torch::Tensor capture(const std::function<torch::Tensor()>& step, torch::Device device) {
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    side.synchronize(), caller.synchronize();
    torch::Tensor first;
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      first = step().clone();
      side.synchronize();
      graph_.capture_begin();
      output_ = step();
      graph_.capture_end();
    }
    side.synchronize();
    return first;
  }
  // The captured step again, on the current stream; its output, overwritten by the next replay.
  const torch::Tensor& replay() {
    graph_.replay();
    return output_;
  }

 private:
  at::cuda::CUDAGraph graph_;
  torch::Tensor output_;
};
#else
class StepGraph {};
#endif

FixedShapeSteps::FixedShapeSteps(const Decoder& decoder, std::vector<ops::KVCache>& caches, const DecodeStep& first, bool graphs)
    : decoder_(decoder), caches_(caches), graphs_(graphs) {
  KUAFU_CHECK(!caches.empty() && caches[0].capacity() > 0, "fixed-shape decoding continues reserved caches");
#ifdef KUAFU_WITH_CUDA
  KUAFU_CHECK(!graphs || decoder.device.is_cuda(), "CUDA graphs replay decoding steps on a CUDA device, not ", decoder.device);
#else
  KUAFU_CHECK(!graphs, "this build has no CUDA: decoding cannot be replayed as CUDA graphs");
#endif
  const auto on_device = torch::TensorOptions(torch::kInt64).device(decoder.device);
  const int64_t rows = first.tokens.size(0), capacity = caches[0].capacity();
  filled_ = caches[0].length();
  slot_ = torch::zeros({1}, on_device);
  for (auto& cache : caches) cache.fix_shape(slot_);
  inputs_.tokens = torch::zeros({rows, 1}, on_device);
  inputs_.positions = torch::zeros({rows, 1}, on_device);
  inputs_.key_padding = torch::zeros({rows, capacity}, on_device.dtype(torch::kBool));  // [B, C]
  if (first.key_padding.defined()) {
    inputs_.key_padding.narrow(1, 0, filled_).copy_(first.key_padding);
  } else {
    inputs_.key_padding.narrow(1, 0, filled_).fill_(true);
  }
}

FixedShapeSteps::~FixedShapeSteps() = default;

torch::Tensor FixedShapeSteps::body() {
  inputs_.key_padding.index_fill_(1, slot_, true);  // the new token is real in every row
  return decoder_.forward(inputs_, caches_);
}

torch::Tensor FixedShapeSteps::run(const DecodeStep& step) {
  KUAFU_CHECK(filled_ < caches_[0].capacity(), "fixed-shape decoding ran past its caches' ", caches_[0].capacity(), " slots");
  inputs_.tokens.copy_(step.tokens);
  inputs_.positions.copy_(step.positions);
  slot_.fill_(filled_);
  ++filled_;
#ifdef KUAFU_WITH_CUDA
  if (graphs_) {
    if (graph_) return graph_->replay();
    graph_ = std::make_unique<StepGraph>();
    return graph_->capture([this] { return body(); }, decoder_.device);
  }
#endif
  return body();
}

}  // namespace kuafu::nn

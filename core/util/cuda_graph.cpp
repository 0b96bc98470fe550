#include "core/util/cuda_graph.h"

#include <exception>
#include <string>

#include "core/util/error.h"

#ifdef KUAFU_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace kuafu {

#ifdef KUAFU_WITH_CUDA
struct CapturedStep::Graph {
  at::cuda::CUDAGraph graph;
  torch::Tensor output;
};
#else
struct CapturedStep::Graph {};
#endif

CapturedStep::CapturedStep(torch::Device device) : device_(device) {
#ifdef KUAFU_WITH_CUDA
  KUAFU_CHECK(device.is_cuda(), "CUDA graphs replay steps on a CUDA device, not ", device);
#else
  fail(detail::concat("this build has no CUDA: a step on ", device, " cannot be replayed as a CUDA graph"));
#endif
}

CapturedStep::~CapturedStep() = default;

torch::Tensor CapturedStep::run(const std::function<torch::Tensor()>& step) {
#ifdef KUAFU_WITH_CUDA
  if (graph_) {
    graph_->graph.replay();
    return graph_->output;
  }
  // Capture needs a stream other than the default one; the replays run on the stream current at the time.
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device_.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
  side.synchronize(), caller.synchronize();
  auto graph = std::make_unique<Graph>();
  torch::Tensor first;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    first = step().clone();
    side.synchronize();
    graph->graph.capture_begin();
    try {
      graph->output = step();
      graph->graph.capture_end();
    } catch (const std::exception& e) {
      fail(std::string("the step could not be captured as a CUDA graph (does it read a value on the host, or change "
                       "shape?): ") + e.what());
    }
  }
  side.synchronize();
  graph_ = std::move(graph);
  return first;
#else
  (void)step;
  fail("this build has no CUDA graphs");
#endif
}

}  // namespace kuafu

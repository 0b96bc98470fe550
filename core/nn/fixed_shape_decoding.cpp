#include "core/nn/fixed_shape_decoding.h"

#include "core/util/error.h"

namespace kuafu::nn {

FixedShapeSteps::FixedShapeSteps(const Decoder& decoder, std::vector<ops::KVCache>& caches, const DecodeStep& first, bool graphs)
    : decoder_(decoder), caches_(caches) {
  KUAFU_CHECK(!caches.empty() && caches[0].capacity() > 0, "fixed-shape decoding continues reserved caches");
  if (graphs) graph_ = std::make_unique<CapturedStep>(decoder.device);  // refuses a device or build without CUDA
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
  if (graph_) return graph_->run([this] { return body(); });
  return body();
}

}  // namespace kuafu::nn

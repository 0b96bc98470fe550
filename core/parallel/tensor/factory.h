// Layer factories: a model asks for a linear layer or an embedding and gets the serial one or the
// tensor-parallel one of the configured mode, with the same parameter names, so it is written once.
#pragma once

#include <memory>

#include "core/parallel/tensor/linear_1d.h"
#include "core/parallel/tensor/tensor_parallel.h"

namespace kuafu::parallel {

// Where a model's layers are cut: the mode and the mesh that holds its axes (no mesh: serial).
struct TensorParallel {
  TensorParallelSpec spec;
  std::shared_ptr<dist::ProcessMesh> mesh;

  bool enabled() const { return spec.mode != TensorMode::kNone && spec.size > 1; }
  // 1D: the ranks one layer is cut over, and this rank's place among them.
  int size() const { return enabled() ? spec.size : 1; }
  dist::GroupPtr group() const;  // the group spanning every tensor-parallel axis (null when serial)
  std::vector<std::string> axes() const { return tensor_axis_names(spec); }
};

// y = x W + b on one device, W stored as `order` says (GPT-2's Conv1D is kInOut).
class SerialLinearImpl : public torch::nn::Module {
 public:
  explicit SerialLinearImpl(const LinearSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;

 private:
  WeightOrder order_;
};
TORCH_MODULE(SerialLinear);

// Token embedding on one device. Unlike torch::nn::Embedding it draws no random numbers when built (the
// model initialises it), so serial and parallel models consume the generator identically.
class SerialEmbeddingImpl : public torch::nn::Module {
 public:
  SerialEmbeddingImpl(int64_t vocab, int64_t dim);
  torch::Tensor forward(const torch::Tensor& ids);
  torch::Tensor weight;  // [vocab, dim]
};
TORCH_MODULE(SerialEmbedding);

// In 1D the caller says how the layer is cut: kColumn (output features; its input is replicated) or
// kRow (input features, taking a column layer's output; its output is replicated).
enum class Cut { kColumn, kRow };

torch::nn::AnyModule make_linear(const TensorParallel& tp, const LinearSpec& spec, Cut cut);

// Token embedding [vocab, dim]: serial, or 1D vocabulary-parallel. Parameter "weight" either way.
torch::nn::AnyModule make_embedding(const TensorParallel& tp, int64_t vocab, int64_t dim);

// The full shape of a parameter whose local block has `local` sizes under `layout`.
std::vector<int64_t> full_shape(at::IntArrayRef local, const Layout& layout, const dist::ProcessMesh& mesh);

}  // namespace kuafu::parallel

// Layer factories: a model asks for a linear layer, a layer norm or an embedding and gets the serial
// one or the tensor-parallel one of the configured mode, with the same parameter names, so it is
// written once. Every mode keeps the model's residual stream in its own activation layout (serial
// and 1D: whole; 2D / 2.5D: batch rows and features cut over the grid; 3D: side kY of the cube) and
// each factory's layer takes and returns that layout.
#pragma once

#include <functional>
#include <map>

#include <memory>
#include <string>
#include <vector>

#include "core/parallel/tensor/embedding.h"
#include "core/parallel/tensor/layout.h"
#include "core/parallel/tensor/linear_1d.h"
#include "core/parallel/tensor/tensor_parallel.h"

namespace kuafu::parallel {

// Where a model's layers are cut: the mode and the mesh that holds its axes (no mesh: serial).
struct TensorParallel {
  TensorParallelSpec spec;
  std::shared_ptr<dist::ProcessMesh> mesh;

  bool enabled() const { return spec.mode != TensorMode::kNone && spec.size > 1; }
  int size() const { return enabled() ? spec.size : 1; }  // ranks of one tensor-parallel group
  // The number of blocks a column layer's output features are cut into: how many ranks share the
  // attention heads (P in 1D, the grid or cube side q otherwise, 1 when serial).
  int feature_blocks() const { return enabled() ? grid_side(spec) : 1; }
  // The number of row blocks the mode cuts a batch into (1 serial and 1D, q in 2D, d q in 2.5D, q^2
  // in 3D): a batch must be a multiple of it.
  int batch_blocks() const;
  dist::GroupPtr group() const;  // the group spanning every tensor-parallel axis (null when serial)
  std::vector<std::string> axes() const { return tensor_axis_names(spec); }
};

// What a model is built with: where its layers are cut, the device on which its serial and replicated
// layers make their parameters (the run's; cut layers use their mesh's), and the group over which its
// blocks cut each sample's activations along an axis (FastFold's DAP; weights stay whole).
// train::Runtime::model_options() gives the run's.
struct ModelOptions {
  ModelOptions() = default;
  // `tp`'s cuts with the serial layers on `device` (a model built on the CPU by default, as in tests;
  // a run's model takes train::Runtime::model_options(), and ModelState refuses parameters elsewhere).
  ModelOptions(TensorParallel tp, torch::Device device = torch::kCPU) : tp(std::move(tp)), device(device) {}  // NOLINT

  // One process's whole model on `device` (benchmarks, evaluation, sampling).
  static ModelOptions serial_on(const torch::Device& device) { return {TensorParallel(), device}; }

  TensorParallel tp;
  torch::Device device = torch::kCPU;  // torch::kMeta: described only, no storage (train/lazy_model.h)
  dist::GroupPtr dap;                  // dynamic axial parallelism (core/parallel/dap); null: off
};

// y = x W + b on one device, W stored as `order` says (GPT-2's Conv1D is kInOut).
class SerialLinearImpl : public torch::nn::Module {
 public:
  explicit SerialLinearImpl(const LinearSpec& spec, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& x);
  WeightOrder order() const { return order_; }
  torch::Tensor weight, bias;

 private:
  WeightOrder order_;
};
TORCH_MODULE(SerialLinear);

// LayerNorm over the last `dim` features, parameters "weight" (ones) and "bias" (zeros) made on `device`
// (torch::nn::LayerNorm makes them on the CPU).
class SerialLayerNormImpl : public torch::nn::Module {
 public:
  SerialLayerNormImpl(int64_t dim, double eps, const torch::Device& device = torch::kCPU);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;

 private:
  double eps_;
};
TORCH_MODULE(SerialLayerNorm);

// RMSNorm over the last `dim` features (Llama's: x / sqrt(mean(x²) + eps) in float32, then the
// parameter "weight" (ones) times it in x's dtype). With `replicas` (a tensor-parallel group whose ranks
// each normalise other features with the same weight, e.g. their own heads), the weight's gradient is
// summed over them.
class SerialRmsNormImpl : public torch::nn::Module {
 public:
  SerialRmsNormImpl(int64_t dim, double eps, const torch::Device& device = torch::kCPU, dist::GroupPtr replicas = nullptr);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
  dist::GroupPtr replicas_;
};
TORCH_MODULE(SerialRmsNorm);

// RMSNorm over features cut across the mesh axis `feature_axis` (2D and 2.5D: tp_col; 3D: tp_y, the residual
// stream's side): each rank's block [..., H/q] adds its sum of squares over that axis, and its weight block
// [H/q] (parameter "weight", ones) is shared by the ranks along `replica_axes` (those cutting the batch
// rows), which sum its gradient.
class CutRmsNormImpl : public torch::nn::Module, public ShardedModule {
 public:
  CutRmsNormImpl(int64_t hidden, const dist::ProcessMesh& mesh, std::string feature_axis, const std::vector<std::string>& replica_axes,
                 double eps);
  torch::Tensor forward(const torch::Tensor& x);  // [..., H/q] -> same
  std::map<std::string, Layout> parameter_layouts() const override;
  torch::Tensor weight;

 private:
  int64_t hidden_;
  double eps_;
  std::string feature_axis_;
  dist::GroupPtr features_, replicas_;
};
TORCH_MODULE(CutRmsNorm);

// Where a linear layer sits in a pair like attention or an MLP: kColumn is the first (its input is the
// residual stream; 1D cuts its output features, 3D turns side kY into kX), kRow the second (it returns
// to the residual stream; 1D cuts its input features, 3D turns kX back into kY). 2D and 2.5D layers
// are the same either way.
enum class Cut { kColumn, kRow };

torch::nn::AnyModule make_linear(const ModelOptions& options, const LinearSpec& spec, Cut cut);

// LayerNorm over `dim` features of the residual stream (parameters "weight" and "bias").
torch::nn::AnyModule make_layer_norm(const ModelOptions& options, int64_t dim, double eps);

// RMSNorm over `dim` features of the residual stream (parameter "weight"), in every tensor mode.
torch::nn::AnyModule make_rms_norm(const ModelOptions& options, int64_t dim, double eps);
// RMSNorm over each attention head's `head_dim` features of a column layer's output (Qwen3's q and k
// norms): one weight shared by every head, so tensor-parallel ranks, each holding whole heads of its own
// (and in 2D, 2.5D and 3D its own batch rows), sum its gradient.
torch::nn::AnyModule make_head_norm(const ModelOptions& options, int64_t head_dim, double eps);

// Token embedding [vocab, dim] with its tied output layer and loss (embedding.h); parameter "weight".
std::shared_ptr<TokenEmbeddingImpl> make_embedding(const ModelOptions& options, int64_t vocab, int64_t dim);

// An embedding [n, dim] added to every batch row of the residual stream, e.g. positions: ids [...] ->
// [..., dim] with the features cut as the residual stream's are; parameter "weight".
torch::nn::AnyModule make_position_embedding(const ModelOptions& options, int64_t n, int64_t dim);

// A classifier head built by make_linear(options, {dim, classes}, Cut::kColumn) leaves this rank a block of
// the logits with the classes cut like the layer's output features. Its mean cross-entropy against the
// whole batch's targets [B, ...] (every rank of the tensor group passes the same), never gathering the
// logits; and the full logits [B, ..., classes] on every rank (differentiable: for losses every rank
// computes alike from the whole logits, e.g. against soft targets; `tp` must outlive the backward).
torch::Tensor classifier_cross_entropy(const TensorParallel& tp, const torch::Tensor& logits,
                                       const torch::Tensor& targets);
torch::Tensor gather_classifier_logits(const TensorParallel& tp, const torch::Tensor& logits);

// How the mode cuts the residual stream, an activation of `dims` dimensions [B, ..., dim] (empty:
// whole on every rank, serial and 1D). Its shard_of is a layer's input block; gather_full undoes it.
Layout stream_layout(const TensorParallel& tp, int64_t dims);

// This rank's batch rows of `rows` [B, ...] (ids, packed rows' documents): cut as the residual stream's rows
// are (2D, 2.5D, 3D), whole along the other dims; all of them serially and in 1D.
torch::Tensor stream_rows(const TensorParallel& tp, const torch::Tensor& rows);

// The residual stream's block of an activation that every rank of the tensor group computed whole from
// replicated parameters (e.g. ViT's patch embeddings). Backward gathers the blocks' gradients, so the
// replicated computation receives its whole gradient on every rank. `tp` must outlive the backward pass
// (models hold theirs).
torch::Tensor enter_stream(const TensorParallel& tp, const torch::Tensor& x);

// Initialises every parameter of `model` as the serial model would be from the same seed: `init`
// fills the full tensor of each parameter (in named_parameters order, always float32, then cast to the
// parameter's dtype) or returns false to keep the parameter as it is; a cut parameter keeps its block,
// so a tensor-parallel model starts equal to the serial one. A parameter on the meta device (lazy
// construction) is drawn and handed to the current WeightSink (core/util/weight_sink.h) when it wants
// it, or dropped (another pipeline stage's), so the others' draws stay the serial model's.
void initialize_like_serial(torch::nn::Module& model, const TensorParallel& tp,
                            const std::function<bool(const std::string& name, torch::Tensor& full)>& init);

// The full shape of a parameter whose local block has `local` sizes under `layout`.
std::vector<int64_t> full_shape(at::IntArrayRef local, const Layout& layout, const dist::ProcessMesh& mesh);

}  // namespace kuafu::parallel

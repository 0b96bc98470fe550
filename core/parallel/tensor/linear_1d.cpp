#include "core/parallel/tensor/linear_1d.h"

#include "core/dist/autograd_collectives.h"
#include "core/util/error.h"

namespace kuafu::parallel {
namespace {

// The dimension of the weight that holds output (or input) features, given the storage order.
int64_t out_dim(WeightOrder order) { return order == WeightOrder::kInOut ? 1 : 0; }
int64_t in_dim(WeightOrder order) { return order == WeightOrder::kInOut ? 0 : 1; }

torch::Tensor matmul(const torch::Tensor& x, const torch::Tensor& weight, WeightOrder order) {
  return order == WeightOrder::kInOut ? torch::matmul(x, weight) : torch::matmul(x, weight.t());
}

std::vector<int64_t> weight_shape(WeightOrder order, int64_t in, int64_t out) {
  return order == WeightOrder::kInOut ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in};
}

void check_divisible(int64_t features, int64_t parts, const char* what) {
  KUAFU_CHECK(features % parts == 0, "tensor parallelism: ", what, " ", features, " is not divisible by ", parts);
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh,
                                                   std::string axis)
    : spec_(spec), axis_(std::move(axis)), group_(mesh.group(axis_)) {
  const int64_t p = mesh.size(axis_);
  check_divisible(spec.out, p * spec.stride, "output features");
  weight = register_parameter("weight", torch::zeros(weight_shape(spec.order, spec.in, spec.out / p), parameter_options(mesh)));
  if (spec.bias) bias = register_parameter("bias", torch::zeros({spec.out / p}, parameter_options(mesh)));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = matmul(dist::autograd::copy_to_group(x, group_), weight, spec_.order);
  return bias.defined() ? y + bias : y;
}

std::map<std::string, Layout> ColumnParallelLinearImpl::parameter_layouts() const {
  std::map<std::string, Layout> layouts = {{"weight", {{out_dim(spec_.order), {axis_}, spec_.stride}}}};
  if (bias.defined()) layouts["bias"] = {{0, {axis_}, spec_.stride}};
  return layouts;
}

RowParallelLinearImpl::RowParallelLinearImpl(const LinearSpec& spec, const dist::ProcessMesh& mesh, std::string axis)
    : spec_(spec), axis_(std::move(axis)), group_(mesh.group(axis_)) {
  const int64_t p = mesh.size(axis_);
  check_divisible(spec.in, p * spec.stride, "input features");
  weight = register_parameter("weight", torch::zeros(weight_shape(spec.order, spec.in / p, spec.out), parameter_options(mesh)));
  if (spec.bias) bias = register_parameter("bias", torch::zeros({spec.out}, parameter_options(mesh)));
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = dist::autograd::reduce_from_group(matmul(x, weight, spec_.order), group_);
  return bias.defined() ? y + bias : y;
}

std::map<std::string, Layout> RowParallelLinearImpl::parameter_layouts() const {
  std::map<std::string, Layout> layouts = {{"weight", {{in_dim(spec_.order), {axis_}, spec_.stride}}}};
  if (bias.defined()) layouts["bias"] = {};  // replicated
  return layouts;
}

}  // namespace kuafu::parallel

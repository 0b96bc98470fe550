// ops::layer_norm against LayerNorm's formula worked in float64 by autograd, on every device the machine
// has: on a GPU through Kuafu's kernels (the test checks that they take these shapes), on the CPU through
// LibTorch's. The output and the gradients of x, the weight and the bias, for a random upstream gradient.
#include <gtest/gtest.h>

#include "core/ops/fused_kernels.h"
#include "core/ops/layer_norm.h"
#include "tests/support/devices.h"

namespace kuafu::ops {
namespace {

struct Normed {
  torch::Tensor y, dx, dweight, dbias;  // float64 on the CPU
};

Normed run_layer_norm(const torch::Tensor& x64, const torch::Tensor& w64, const torch::Tensor& b64, const torch::Tensor& dy64,
                      torch::ScalarType type, const torch::Device& device, bool formula) {
  auto leaf = [&](const torch::Tensor& t) { return t.to(device, type).clone().requires_grad_(true); };  // never x64 itself
  const torch::Tensor x = leaf(x64), w = leaf(w64), b = leaf(b64);
  torch::Tensor y;
  if (formula) {
    const torch::Tensor mean = x.mean(-1, true), var = (x - mean).square().mean(-1, true);
    y = (x - mean) / (var + 1e-5).sqrt() * w + b;
  } else {
    y = layer_norm(x, w, b, 1e-5);
  }
  y.backward(dy64.to(device, type));
  auto back = [](const torch::Tensor& t) { return t.detach().cpu().to(torch::kFloat64); };
  return {back(y), back(x.grad()), back(w.grad()), back(b.grad())};
}

double relative_to_largest(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got - want).abs().max() / want.abs().max()).item<double>();
}

// float32: the kernels sum a row of 768 in another order than the formula, a few 1e-7 relative; 1e-5
// is far below a real mistake (a wrong mean or scale: O(1e-1)). bf16: inputs, outputs and gradients are
// rounded to bf16 (2^-8 relative) and the weight's gradient sums 111 rows: 2e-2 relative to the largest.
TEST(LayerNormTest, EqualsTheFormulaInFloat64OnEveryDevice) {
  torch::manual_seed(5);
  for (const int64_t columns : {int64_t{768}, int64_t{256}, int64_t{100}}) {
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    const torch::Tensor x = torch::randn({3, 37, columns}, f64) * 2 + 0.5, dy = torch::randn({3, 37, columns}, f64);
    const torch::Tensor w = torch::rand({columns}, f64) + 0.5, b = torch::randn({columns}, f64);
    const Normed want = run_layer_norm(x, w, b, dy, torch::kFloat64, torch::kCPU, /*formula=*/true);
    for (const torch::Device& device : testing::devices_to_test()) {
      for (const auto& [type, tolerance] : {std::pair{torch::kFloat32, 1e-5}, std::pair{torch::kBFloat16, 2e-2}}) {
        const std::string what = std::to_string(columns) + " columns, " + c10::toString(type) + " on " + device.str();
        if (device.is_cuda() && columns % 256 == 0) {
          const auto opts = torch::TensorOptions().device(device).dtype(type);
          EXPECT_TRUE(layer_norm_kernel_takes(torch::zeros({2, columns}, opts), torch::ones({columns}, opts),
                                              torch::zeros({columns}, opts)))
              << what;
        }
        const Normed got = run_layer_norm(x, w, b, dy, type, device, /*formula=*/false);
        EXPECT_LE(relative_to_largest(got.y, want.y), tolerance) << what << ": y";
        EXPECT_LE(relative_to_largest(got.dx, want.dx), tolerance) << what << ": dx";
        EXPECT_LE(relative_to_largest(got.dweight, want.dweight), tolerance) << what << ": dweight";
        EXPECT_LE(relative_to_largest(got.dbias, want.dbias), tolerance) << what << ": dbias";
      }
    }
  }
}

// runtime.fused_layer_norm = false takes LibTorch's LayerNorm: the same values within the same bounds.
TEST(LayerNormTest, TurnedOffItIsLibTorchs) {
  const FusedKernels before = fused_kernels();
  set_fused_kernels({before.loss, false});
  for (const torch::Device& device : testing::devices_to_test()) {
    const torch::Tensor x = torch::randn({5, 256}, torch::TensorOptions().device(device));
    const torch::Tensor w = torch::rand({256}, x.options()), b = torch::randn({256}, x.options());
    EXPECT_TRUE(torch::equal(layer_norm(x, w, b, 1e-5), torch::layer_norm(x, {256}, w, b, 1e-5))) << device;
  }
  set_fused_kernels(before);
}

}  // namespace
}  // namespace kuafu::ops

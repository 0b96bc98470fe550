// The streaming product for a few rows (ops/skinny_linear.h) against the same product in float64, on its
// AVX2 path and its scalar path, and where the layers take it (decoding under no gradient) and where they
// must not (training, other dtypes, more rows).
#include <gtest/gtest.h>

#include <cmath>

#include "core/ops/fused_kernels.h"
#include "core/ops/skinny_linear.h"
#include "core/parallel/tensor/embedding.h"
#include "core/parallel/tensor/factory.h"
#include "core/util/error.h"

namespace kuafu::ops {
namespace {

// Rows of 1 to 32 (whole tiles of 4 rows and 3 outputs, and their tails), widths that leave a tail past the
// 8-float vectors, outputs fewer and more than a thread's share, with and without bias. Float32 sums of `in` products against
// float64: within 2e-6 of the largest sum of the products' magnitudes (a float32 sum's rounding errors, each
// at most 6e-8 of it, add up like a random walk: sqrt(771) x 6e-8 = 1.7e-6; a lost term or bias moves an
// output by ~1, over 1e-3 of it).
TEST(SkinnyLinearTest, EqualsTheProductInFloat64OnEveryPath) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  for (const int64_t rows : {1, 3, 5, 8, 9, 16, 32}) {
    for (const int64_t in : {5, 64, 771}) {
      for (const int64_t out : {1, 37, 300}) {
        const torch::Tensor x = torch::randn({rows, in}), w = torch::randn({out, in}), b = torch::randn({out});
        for (const bool with_bias : {false, true}) {
          const torch::Tensor bias = with_bias ? b : torch::Tensor();
          torch::Tensor expected = torch::mm(x.to(torch::kFloat64), w.to(torch::kFloat64).t());
          if (with_bias) expected += b.to(torch::kFloat64);
          const double magnitude = torch::mm(x.abs().to(torch::kFloat64), w.abs().to(torch::kFloat64).t()).max().item<double>();
          for (const bool vector : {true, false}) {
            const torch::Tensor y = skinny_linear(x, w, bias, vector);
            ASSERT_EQ(y.sizes(), expected.sizes());
            EXPECT_LT((y.to(torch::kFloat64) - expected).abs().max().item<double>(), 2e-6 * magnitude)
                << rows << " x " << in << " -> " << out << (with_bias ? " with bias" : "") << (vector ? " avx2" : " scalar");
          }
        }
      }
    }
  }
  // Leading dimensions are kept: a decoding step's [B, 1, in].
  const torch::Tensor x = torch::randn({4, 1, 32}), w = torch::randn({10, 32});
  EXPECT_TRUE(torch::allclose(skinny_linear(x, w, {}), torch::matmul(x, w.t()), 1e-5, 1e-5));
}

TEST(SkinnyLinearTest, ServesOnlyNoGradFloat32CpuCallsOfFewRows) {
  const torch::Tensor w = torch::randn({6, 8}), x = torch::randn({2, 8});
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(skinny_linear_applies(x, w, {}));
    EXPECT_TRUE(skinny_linear_applies(torch::randn({kSkinnyRowsMax, 8}), w, torch::randn({6})));
    EXPECT_FALSE(skinny_linear_applies(torch::randn({kSkinnyRowsMax + 1, 8}), w, {}));
    EXPECT_FALSE(skinny_linear_applies(x.to(torch::kFloat64), w.to(torch::kFloat64), {}));
    EXPECT_FALSE(skinny_linear_applies(x, w.t().contiguous().t(), {}));  // a transposed view
    EXPECT_FALSE(skinny_linear_applies(torch::randn({2, 7}), w, {}));
    EXPECT_THROW(skinny_linear(torch::randn({2, 7}), w, {}), Error);
    const FusedKernels before = fused_kernels();
    set_fused_kernels({before.loss, before.layer_norm, /*skinny_linear=*/false});  // runtime.skinny_linear = false
    EXPECT_FALSE(skinny_linear_applies(x, w, {}));
    set_fused_kernels(before);
  }
  // With gradients on it has no backward to give: the layers keep LibTorch's product, frozen ones too.
  EXPECT_FALSE(skinny_linear_applies(x, w.clone().requires_grad_(true), {}));
  EXPECT_FALSE(skinny_linear_applies(x, w, {}));
}

// The serial linear layer and the tied output layer take it in a decoding step and give LibTorch's
// product; with gradients on they still train (the gradient flows).
TEST(SkinnyLinearTest, TheLayersDecodeThroughItAndStillTrain) {
  torch::manual_seed(1);
  parallel::SerialLinear linear(parallel::LinearSpec{24, 40, /*bias=*/true}, torch::kCPU);
  parallel::SerialEmbedding embedding(50, 24, torch::kCPU);
  const torch::Tensor x = torch::randn({3, 1, 24});
  torch::Tensor plain = torch::nn::functional::linear(x, linear->weight, linear->bias).detach();
  torch::Tensor plain_logits = torch::matmul(x, embedding->weight.t()).detach();
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(skinny_linear_applies(x, linear->weight, linear->bias));
    EXPECT_TRUE(torch::allclose(linear->forward(x), plain, 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(embedding->logits(x), plain_logits, 1e-5, 1e-5));
  }
  linear->forward(x).sum().backward();
  ASSERT_TRUE(linear->weight.grad().defined());
  EXPECT_TRUE(torch::allclose(linear->weight.grad(), torch::ones({40, 1}) * x.reshape({3, 24}).sum(0).unsqueeze(0), 1e-5, 1e-5));
}

}  // namespace
}  // namespace kuafu::ops

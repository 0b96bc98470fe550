// The CPU sum of squares behind every float32 gradient norm on the host: exact where the sum is
// representable (worked by hand), near LibTorch's float64 sum elsewhere, and the same bits on every
// path and thread count.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "core/optim/cpu_sum_of_squares.h"
#include "core/optim/optimizer.h"

namespace kuafu::optim {
namespace {

// Around the 16 lanes, the 65,536-value blocks, and long enough to split over threads with a ragged end.
const std::vector<int64_t> kSumLengths = {0, 1, 15, 16, 17, 65535, 65536, 65537, 3 * 65536 + 5, 1000003};

TEST(CpuSumOfSquaresTest, HalvesOfSmallIntegersSumExactly) {
  // x_i = ((i mod 17) - 8) / 2: each square is a multiple of 1/4 below 17, so every partial sum of up to a
  // million of them is exact in float64 and any order gives sum_i ((i mod 17) - 8)^2 / 4, counted here in integers.
  for (int64_t n : kSumLengths) {
    std::vector<float> x(static_cast<size_t>(n));
    int64_t quarters = 0;  // the sum times 4
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = i % 17 - 8;
      x[static_cast<size_t>(i)] = static_cast<float>(k) / 2.0f;
      quarters += k * k;
    }
    EXPECT_EQ(cpu_sum_of_squares(x.data(), n), static_cast<double>(quarters) / 4.0) << n << " values";
    EXPECT_EQ(cpu_sum_of_squares(x.data(), n, CpuPath::kScalar), static_cast<double>(quarters) / 4.0) << n;
  }
}

TEST(CpuSumOfSquaresTest, RandomValuesMatchLibTorchsFloat64SumAndEveryPathGivesTheSameBits) {
  torch::manual_seed(3);
  const int threads = at::get_num_threads();
  for (int64_t n : kSumLengths) {
    const torch::Tensor x = torch::randn({n}) * 3;  // [n] float32
    const double reference = x.to(torch::kFloat64).square().sum().item<double>();
    const double best = cpu_sum_of_squares(x.data_ptr<float>(), n);
    // Two float64 sums of the same exact squares in different orders: each within n * 2^-53 of the exact
    // sum (positive terms), so within 1e-9 relative for a million terms; they agree far closer in practice.
    EXPECT_NEAR(best, reference, 1e-9 * reference + 1e-300) << n << " values";
    EXPECT_EQ(cpu_sum_of_squares(x.data_ptr<float>(), n, CpuPath::kScalar), best) << n;
    at::set_num_threads(1);
    EXPECT_EQ(cpu_sum_of_squares(x.data_ptr<float>(), n), best) << n << " on one thread";
    at::set_num_threads(threads);
  }
}

TEST(CpuSumOfSquaresTest, SquaredNormTakesItForContiguousFloat32AndLibTorchElsewhere) {
  torch::manual_seed(4);
  const torch::Tensor w = torch::randn({300, 70});  // [300, 70] float32
  const double reference = w.to(torch::kFloat64).square().sum().item<double>();
  const torch::Tensor fast = squared_norm(w);
  EXPECT_EQ(fast.scalar_type(), torch::kFloat64);
  EXPECT_EQ(fast.dim(), 0);
  EXPECT_EQ(fast.item<double>(), cpu_sum_of_squares(w.data_ptr<float>(), w.numel()));
  EXPECT_NEAR(fast.item<double>(), reference, 1e-12 * reference);
  // A transposed view and a float64 tensor take LibTorch's norm (then squared: a last-bits difference).
  EXPECT_NEAR(squared_norm(w.t()).item<double>(), reference, 1e-12 * reference);
  EXPECT_NEAR(squared_norm(w.to(torch::kFloat64)).item<double>(), reference, 1e-12 * reference);
}

}  // namespace
}  // namespace kuafu::optim

// The fused output-layer cross-entropy (core/ops/linear_cross_entropy.h) against PyTorch's own unfused
// loss, cross_entropy(float(hidden Wᵀ)), on every device the machine has (the GPU's kernel path where one
// is visible): the loss and the gradients of hidden and W for a loss gradient other than 1, through
// several chunks, a padded vocabulary and ignored rows.
#include <gtest/gtest.h>

#include "core/ops/cross_entropy_rows_cpu.h"
#include "core/ops/linear_cross_entropy.h"
#include "tests/support/devices.h"

namespace kuafu::ops {
namespace {

constexpr int64_t kIgnored = -100;

struct LossCase {
  torch::Tensor hidden;   // [N, C]
  torch::Tensor weight;   // [V, C]
  torch::Tensor targets;  // [N], some ignored
};

// N = 37 rows of width 16 over a vocabulary of 29 (not a multiple of anything), every fifth row ignored.
LossCase random_case(torch::ScalarType type, const torch::Device& device, int64_t rows = 37, int64_t vocab = 29) {
  torch::manual_seed(11);
  const auto options = torch::TensorOptions().dtype(torch::kFloat64);
  LossCase c{torch::randn({rows, 16}, options), torch::randn({vocab, 16}, options) * 0.7,
             torch::randint(vocab, {rows}, torch::kInt64)};
  c.targets.index_put_({torch::arange(0, rows, 5)}, kIgnored);
  c.hidden = c.hidden.to(device, type).requires_grad_(true);
  c.weight = c.weight.to(device, type).requires_grad_(true);
  c.targets = c.targets.to(device);
  return c;
}

struct LossAndGradients {
  torch::Tensor loss, hidden, weight;
};

// The loss and, for a loss gradient of 0.37 (as a micro-batch's share would be), the inputs' gradients.
template <typename Loss>
LossAndGradients run(const LossCase& c, Loss loss_of) {
  c.hidden.mutable_grad() = torch::Tensor();
  c.weight.mutable_grad() = torch::Tensor();
  const torch::Tensor loss = loss_of(c.hidden, c.weight, c.targets);
  (loss * 0.37).backward();
  return {loss.detach().cpu().to(torch::kFloat64), c.hidden.grad().cpu().to(torch::kFloat64),
          c.weight.grad().cpu().to(torch::kFloat64)};
}

LossAndGradients plain(const LossCase& c) {
  return run(c, [](const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& t) {
    return plain_linear_cross_entropy(h, w, t, kIgnored);
  });
}

LossAndGradients fused(const LossCase& c, LinearCrossEntropyOptions options = {}) {
  return run(c, [&](const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& t) {
    return linear_cross_entropy(h, w, t, kIgnored, options);
  });
}

double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

void expect_close(const LossAndGradients& got, const LossAndGradients& want, double tolerance, const std::string& what) {
  EXPECT_LE(relative_difference(got.loss, want.loss), tolerance) << what << ": loss " << got.loss << " vs " << want.loss;
  EXPECT_LE(relative_difference(got.hidden, want.hidden), tolerance) << what << ": gradient of hidden";
  EXPECT_LE(relative_difference(got.weight, want.weight), tolerance) << what << ": gradient of W";
}

// float64: the same maths, only the order of summation differs (the chunks' products, the log-sum-exp):
// a few 1e-16 relative; 1e-12 is far below any real mistake (a missing row, a wrong scale: O(0.1)).
TEST(LinearCrossEntropyTest, EqualsPyTorchsLossAndGradientsInFloat64ThroughChunksAndPadding) {
  for (const torch::Device& device : testing::devices_to_test()) {
    const LossCase c = random_case(torch::kFloat64, device);
    const LossAndGradients want = plain(c);
    EXPECT_GT(want.loss.item<double>(), 1.0);
    // 5 rows per chunk (37 = 7 x 5 + 2) and W padded from 29 to 32 rows.
    expect_close(fused(c, {5 * 32 * 4, 8}), want, 1e-12, "chunks of 5 rows, padded to 32, " + device.str());
    expect_close(fused(c, {1, 1}), want, 1e-12, "one row per chunk, " + device.str());
    expect_close(fused(c), want, 1e-12, "the device's defaults, " + device.str());
  }
}

// float32: the GPU's and the CPU's kernels take the softmax with a fast exponential (a few ulp) and sums in another
// order than PyTorch's log_softmax: 1e-5 relative to the largest value covers that with room, and a
// wrong term would be O(1e-1). bfloat16: both sides round the same bf16 logits, but the chunks' products
// may round a logit differently (one bf16 ulp, 2^-8) and the gradients are bf16 products of bf16
// gradients of the logits: 2e-2 relative to the largest value.
TEST(LinearCrossEntropyTest, EqualsPyTorchsLossInFloat32AndBfloat16OnEveryDevice) {
  const std::pair<torch::ScalarType, double> cases[] = {{torch::kFloat32, 1e-5}, {torch::kBFloat16, 2e-2}};
  for (const torch::Device& device : testing::devices_to_test()) {
    for (const auto& [type, tolerance] : cases) {
      const LossCase c = random_case(type, device, 300, 1000);
      const LossAndGradients want = plain(c);
      const std::string what = std::string(c10::toString(type)) + " on " + device.str();
      expect_close(fused(c), want, tolerance, what);
      expect_close(fused(c, {64 * 1024 * 4, 0}), want, tolerance, what + ", chunks of 64 rows");
      EXPECT_EQ(linear_cross_entropy(c.hidden, c.weight, c.targets, kIgnored).scalar_type(), torch::kFloat32) << what;
    }
  }
}

TEST(LinearCrossEntropyTest, WithoutGradientsOrWithAFrozenWeightGivesWhatIsAsked) {
  for (const torch::Device& device : testing::devices_to_test()) {
    const LossCase c = random_case(torch::kFloat64, device);
    const LossAndGradients want = plain(c);
    {
      torch::NoGradGuard no_grad;
      const torch::Tensor loss = linear_cross_entropy(c.hidden, c.weight, c.targets, kIgnored, {5 * 32 * 4, 8});
      EXPECT_FALSE(loss.requires_grad());
      EXPECT_LE(relative_difference(loss.cpu(), want.loss), 1e-12);
    }
    // A frozen output layer (LoRA's base): only hidden's gradient, the same as PyTorch's.
    const torch::Tensor frozen = c.weight.detach();
    c.hidden.mutable_grad() = torch::Tensor();
    (linear_cross_entropy(c.hidden, frozen, c.targets, kIgnored) * 0.37).backward();
    EXPECT_LE(relative_difference(c.hidden.grad().cpu(), want.hidden), 1e-12) << device;
  }
}

TEST(LinearCrossEntropyTest, NoLearnedRowGivesZeroAndZeroGradients) {
  for (const torch::Device& device : testing::devices_to_test()) {
    LossCase c = random_case(torch::kFloat32, device);
    c.targets.fill_(kIgnored);
    const LossAndGradients got = fused(c);
    EXPECT_EQ(got.loss.item<double>(), 0.0) << device;
    EXPECT_EQ(got.hidden.abs().max().item<double>(), 0.0) << device;
    EXPECT_EQ(got.weight.abs().max().item<double>(), 0.0) << device;
  }
}

TEST(LinearCrossEntropyTest, MisshapenInputsAreNamed) {
  const torch::Tensor hidden = torch::randn({4, 8}), weight = torch::randn({10, 8});
  try {
    linear_cross_entropy(hidden, weight, torch::zeros({5}, torch::kInt64), kIgnored);
    FAIL() << "four rows with five targets were accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("targets [N]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kuafu::ops

namespace kuafu::ops {
namespace {

// The CPU row kernel alone, both paths, against the formula in float64: rows of 1,003 valid columns (a
// ragged end past the 8-wide vectors) 1,008 floats apart, every fourth row ignored. Each float32 value
// (the exponentials are glibc's, within 4 ulp; softmax rounded once more by the scale) is within 1e-6 of
// the float64 result relative to the largest; a wrong term is O(1e-3) (one probability in a thousand).
TEST(CpuCrossEntropyRowsTest, BothPathsEqualTheFormulaAndAWrongTargetIsNamed) {
  torch::manual_seed(12);
  const int64_t rows = 40, columns = 1003, stride = 1008;
  const torch::Tensor logits = torch::randn({rows, stride}) * 4;               // [40, 1008] float32
  torch::Tensor targets = torch::randint(columns, {rows}, torch::kInt64);  // [40]
  targets.index_put_({torch::arange(0, rows, 4)}, kIgnored);
  const torch::Tensor learned = targets.ne(kIgnored);
  const torch::Tensor scale = learned.to(torch::kFloat32) * 0.25;  // [40]
  // The formula: loss = logsumexp - picked; gradient = (softmax - onehot) * scale, 0 past the columns.
  const torch::Tensor x = logits.narrow(1, 0, columns).to(torch::kFloat64);
  const torch::Tensor safe = targets.masked_fill(learned.logical_not(), 0).unsqueeze(1);
  const torch::Tensor want_loss = (x.logsumexp(1) - x.gather(1, safe).squeeze(1)).masked_fill(learned.logical_not(), 0);
  torch::Tensor want_gradient = torch::zeros({rows, stride}, torch::kFloat64);
  want_gradient.narrow(1, 0, columns)
      .copy_((x.softmax(1) - torch::zeros_like(x).scatter_(1, safe, 1.0)) * scale.to(torch::kFloat64).unsqueeze(1));
  for (const CpuPath path : {CpuPath::kBest, CpuPath::kScalar}) {
    const std::string what = path == CpuPath::kBest ? "best path" : "scalar path";
    torch::Tensor z = logits.clone();
    torch::Tensor loss = torch::empty({rows});
    cpu::cross_entropy_rows(z.data_ptr<float>(), rows, stride, columns, targets.data_ptr<int64_t>(), kIgnored,
                            scale.data_ptr<float>(), loss.data_ptr<float>(), /*write_gradient=*/false, path);
    EXPECT_TRUE(torch::equal(z, logits)) << what << ": the logits changed without a gradient asked";
    EXPECT_LE(relative_difference(loss.to(torch::kFloat64), want_loss), 1e-6) << what;
    cpu::cross_entropy_rows(z.data_ptr<float>(), rows, stride, columns, targets.data_ptr<int64_t>(), kIgnored,
                            scale.data_ptr<float>(), loss.data_ptr<float>(), /*write_gradient=*/true, path);
    EXPECT_LE(relative_difference(loss.to(torch::kFloat64), want_loss), 1e-6) << what;
    EXPECT_LE(relative_difference(z.to(torch::kFloat64), want_gradient), 1e-6) << what << ": gradient";
  }
  torch::Tensor z = logits.clone();
  torch::Tensor loss = torch::empty({rows});
  targets[7] = columns;  // one past the vocabulary
  try {
    cpu::cross_entropy_rows(z.data_ptr<float>(), rows, stride, columns, targets.data_ptr<int64_t>(), kIgnored,
                            scale.data_ptr<float>(), loss.data_ptr<float>(), /*write_gradient=*/true);
    FAIL() << "a target outside the vocabulary was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("row 7's target 1003"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(z, logits)) << "a rejected call changed the logits";
}

// bfloat16 logits: each row widened, passed as float32 rows are, and its gradient rounded back as LibTorch's copy
// to bfloat16 rounds; so the same bits as the float32 kernel (the same path) on the widened rows with its gradient
// rounded by LibTorch: the loss and every gradient value exactly, the padding zero, on both paths.
TEST(CpuCrossEntropyRowsTest, BFloat16RowsAreTheFloat32RowsRounded) {
  torch::manual_seed(13);
  const int64_t rows = 40, columns = 1003, stride = 1008;
  const torch::Tensor logits = (torch::randn({rows, stride}) * 4).to(torch::kBFloat16);  // [40, 1008]
  torch::Tensor targets = torch::randint(columns, {rows}, torch::kInt64);                // [40]
  targets.index_put_({torch::arange(0, rows, 4)}, kIgnored);
  const torch::Tensor scale = targets.ne(kIgnored).to(torch::kFloat32) * 0.25;  // [40]
  auto bits = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
  for (const CpuPath path : {CpuPath::kBest, CpuPath::kScalar}) {
    const std::string what = path == CpuPath::kBest ? "best path" : "scalar path";
    torch::Tensor want = logits.to(torch::kFloat32);
    torch::Tensor want_loss = torch::empty({rows});
    cpu::cross_entropy_rows(want.data_ptr<float>(), rows, stride, columns, targets.data_ptr<int64_t>(), kIgnored,
                            scale.data_ptr<float>(), want_loss.data_ptr<float>(), /*write_gradient=*/true, path);
    torch::Tensor z = logits.clone();
    torch::Tensor loss = torch::empty({rows});
    cpu::cross_entropy_rows_bf16(bits(z), rows, stride, columns, targets.data_ptr<int64_t>(), kIgnored,
                                 scale.data_ptr<float>(), loss.data_ptr<float>(), /*write_gradient=*/false, path);
    EXPECT_TRUE(torch::equal(z, logits)) << what << ": the logits changed without a gradient asked";
    EXPECT_TRUE(torch::equal(loss, want_loss)) << what;
    cpu::cross_entropy_rows_bf16(bits(z), rows, stride, columns, targets.data_ptr<int64_t>(), kIgnored,
                                 scale.data_ptr<float>(), loss.data_ptr<float>(), /*write_gradient=*/true, path);
    EXPECT_TRUE(torch::equal(loss, want_loss)) << what;
    EXPECT_TRUE(torch::equal(z, want.to(torch::kBFloat16))) << what << ": gradient";
    EXPECT_TRUE(torch::equal(z.narrow(1, columns, stride - columns), torch::zeros({rows, stride - columns}, torch::kBFloat16)));
    EXPECT_GT(z.narrow(1, 0, columns).abs().max().item<float>(), 0.0f) << what;
  }
  torch::Tensor z = logits.clone();
  torch::Tensor loss = torch::empty({rows});
  targets[9] = -1;
  EXPECT_THROW(cpu::cross_entropy_rows_bf16(bits(z), rows, stride, columns, targets.data_ptr<int64_t>(), kIgnored,
                                            scale.data_ptr<float>(), loss.data_ptr<float>(), /*write_gradient=*/true),
               std::exception);
  EXPECT_TRUE(torch::equal(z, logits)) << "a rejected call changed the logits";
}

}  // namespace
}  // namespace kuafu::ops

// core/util/bfloat16_cpu.h against LibTorch's own conversions, both paths (AVX2 and the portable loop):
// every one of the 65,536 bfloat16 bit patterns widened, and float32 values rounded (random values over the
// whole exponent range, ties either way, subnormals, infinities, NaN, the largest floats that round up to
// infinity), bit for bit. Counts that are not a multiple of 8 take the vector loop and its tail.
#include <gtest/gtest.h>

#include <c10/util/BFloat16.h>
#include <torch/torch.h>

#include <cstring>
#include <limits>
#include <vector>

#include "core/util/bfloat16_cpu.h"

namespace kuafu::bf16_test {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// float32 values whose rounding to bfloat16 is worth checking, 4,099 of them.
std::vector<float> values_to_round() {
  std::vector<float> v;
  torch::manual_seed(5);
  const torch::Tensor random = torch::randn({3000}) * torch::pow(10.0, torch::randint(-40, 38, {3000}).to(torch::kFloat64));
  for (int64_t i = 0; i < random.numel(); ++i) v.push_back(random[i].item<float>());
  for (const uint32_t high : {0x3f80u, 0x3f81u, 0xbf80u, 0xbf81u, 0x0000u, 0x0001u, 0x8001u, 0x7f7fu, 0xff7fu}) {
    for (const uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) v.push_back(from_bits(high << 16 | low));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (const float special : {inf, -inf, std::nanf(""), -std::nanf(""), 0.0f, -0.0f, std::numeric_limits<float>::max(),
                              std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()}) {
    v.push_back(special);
  }
  while (v.size() < 4099) v.push_back(static_cast<float>(v.size()) * 0.37f - 300.0f);
  return v;
}

TEST(BFloat16CpuTest, EveryBitPatternWidensAsLibTorchWidensIt) {
  std::vector<uint16_t> all(65536 + 3);  // and three more: a tail after the vectors
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  const torch::Tensor want = torch::from_blob(all.data(), {static_cast<int64_t>(all.size())}, torch::kBFloat16).to(torch::kFloat32);
  for (const CpuPath path : {CpuPath::kBest, CpuPath::kScalar}) {
    torch::Tensor got = torch::empty_like(want);
    bf16::to_float(all.data(), got.data_ptr<float>(), got.numel(), path);
    EXPECT_TRUE(torch::equal(got.view(torch::kInt32), want.view(torch::kInt32))) << (path == CpuPath::kBest ? "best" : "scalar");
  }
}

TEST(BFloat16CpuTest, RoundsToNearestEvenAsLibTorch) {
  const std::vector<float> v = values_to_round();
  const torch::Tensor x = torch::tensor(v);  // [4099] float32
  const torch::Tensor by_libtorch = x.to(torch::kBFloat16).view(torch::kInt16);
  const torch::Tensor nan = x.isnan();
  for (const CpuPath path : {CpuPath::kBest, CpuPath::kScalar}) {
    const std::string what = path == CpuPath::kBest ? "best path" : "scalar path";
    std::vector<uint16_t> got(v.size());
    bf16::from_float(v.data(), got.data(), static_cast<int64_t>(v.size()), path);
    for (size_t i = 0; i < v.size(); ++i) {  // c10::BFloat16(float), the definition, NaN included
      ASSERT_EQ(got[i], c10::BFloat16(v[i]).x) << what << " at " << i << ": " << v[i];
    }
    // LibTorch's vectorised copy writes another NaN's bits; every other value bit for bit.
    const torch::Tensor got_bits = torch::from_blob(got.data(), {x.numel()}, torch::kInt16);
    EXPECT_TRUE(torch::equal(got_bits.masked_fill(nan, 0), by_libtorch.masked_fill(nan, 0))) << what;
    EXPECT_TRUE(got_bits.view(torch::kBFloat16).to(torch::kFloat32).isnan().equal(nan)) << what;
  }
  EXPECT_EQ(bf16::from_float(from_bits(0x3f808000u)), 0x3f80) << "a tie goes to the even neighbour (down)";
  EXPECT_EQ(bf16::from_float(from_bits(0x3f818000u)), 0x3f82) << "a tie goes to the even neighbour (up)";
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::max()), 0x7f80) << "the largest float rounds to infinity";
  EXPECT_EQ(bf16::from_float(from_bits(0x00018000u)), 0x0002) << "subnormals are kept, not flushed";
}

}  // namespace kuafu::bf16_test

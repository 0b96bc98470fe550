// benchmark.profile_steps (core/train/step_profile.h): the profiled steps' time lands on the operators
// that took it, by self time, and kernel names are sorted into the kinds the reports use.
#include <gtest/gtest.h>

#include <string>

#include "core/train/step_profile.h"

namespace kuafu::train {
namespace {

TEST(StepProfileTest, CpuOperatorsByTheirOwnTimeAndKind) {
  const torch::Tensor a = torch::randn({768, 768}), b = torch::randn({768, 768});
  // Two products of 768 x 768 (1.8 GFLOP) and a GELU over one row: the products must take most of the
  // time, and the GELU (whose kernels' names hold "lambda") must not count as the optimizer. The step runs
  // once before it is profiled, as the benchmark's profiled steps follow its timed ones: a first call's
  // one-off costs (once 97 ms in GELU's first call under CI's load) are not the step's.
  const auto step = [&] { torch::gelu(torch::mm(torch::mm(a, b), b).narrow(0, 0, 1)); };
  step();
  const nlohmann::json profile = profile_steps(step, 3, torch::kCPU);
  EXPECT_EQ(profile.at("source"), "cpu operators");
  EXPECT_EQ(profile.at("steps"), 3);
  const nlohmann::json& kinds = profile.at("ms_per_step_by_kind");
  ASSERT_TRUE(kinds.contains("matmul")) << kinds.dump();
  ASSERT_TRUE(kinds.contains("gelu")) << kinds.dump();
  EXPECT_GT(kinds.at("matmul").get<double>(), kinds.at("gelu").get<double>()) << kinds.dump();
  EXPECT_FALSE(kinds.contains("optimizer")) << kinds.dump();
  EXPECT_EQ(profile.at("top").at(0).at(0).get<std::string>(), "aten::mm") << profile.at("top").dump();
}

TEST(StepProfileTest, KernelNamesSortIntoKinds) {
  EXPECT_EQ(kind_of_work("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"), "matmul");
  EXPECT_EQ(kind_of_work("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>"), "matmul");
  EXPECT_EQ(kind_of_work("void kuafu::ops::cuda::(anonymous namespace)::cross_entropy_rows_kernel<__nv_bfloat16>"), "loss");
  EXPECT_EQ(kind_of_work("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16"), "attention");
  EXPECT_EQ(kind_of_work("void at::native::vectorized_elementwise_kernel<8, at::native::GeluBackwardCUDAKernelImpl("
                         "at::TensorIteratorBase&)::{lambda()#2}>"),
            "gelu");
  EXPECT_EQ(kind_of_work("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16>"),
            "norm");
  EXPECT_EQ(kind_of_work("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>"),
            "optimizer");
  EXPECT_EQ(kind_of_work("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<float>>"), "other");
}

}  // namespace
}  // namespace kuafu::train

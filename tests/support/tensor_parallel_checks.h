// Checks shared by the tensor-parallel tests: a parallel block against the serial tensor (with the
// largest difference in the message), and loading a block of a serial tensor into a parameter.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/parallel/tensor/layout.h"

namespace kuafu::testing {

inline void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what,
                         double tolerance) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(torch::allclose(actual, expected, tolerance, tolerance))
      << what << ": max difference " << (actual - expected).abs().max().item<double>();
}

// target <- this rank's block of `full` under `layout`.
inline void load_block(torch::Tensor& target, const torch::Tensor& full, const parallel::Layout& layout,
                       const dist::ProcessMesh& mesh) {
  torch::NoGradGuard no_grad;
  target.copy_(parallel::shard_of(full, layout, mesh));
}

}  // namespace kuafu::testing

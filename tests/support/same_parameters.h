// Two modules holding the same parameters, bit for bit: a model built lazily against the one built
// eagerly from the same seed, or one loaded in bf16 against the float32 load cast.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>

namespace kuafu::testing {

// Every parameter of `expected` is one of `got` under the same name and equal to it, bit for bit
// (`expected`'s cast to `dtype` first when given, and `got`'s then held in `dtype`), and `got` holds no
// other. `context` is added to each failure.
inline void expect_same_parameters(const torch::nn::Module& got, const torch::nn::Module& expected,
                                   std::optional<torch::Dtype> dtype = std::nullopt, const std::string& context = "") {
  const auto held = got.named_parameters();
  const auto wanted = expected.named_parameters();
  EXPECT_EQ(held.size(), wanted.size()) << context;
  for (const auto& item : wanted) {
    const torch::Tensor* mine = held.find(item.key());
    if (!mine) {
      ADD_FAILURE() << item.key() << " is missing " << context;
      continue;
    }
    if (dtype) {
      EXPECT_EQ(mine->scalar_type(), *dtype) << item.key() << " " << context;
    }
    EXPECT_TRUE(torch::equal(*mine, dtype ? item.value().to(*dtype) : item.value())) << item.key() << " " << context;
  }
}

}  // namespace kuafu::testing

// The golden files of DeepMind's AlphaFold 2.3 on a tiny model (tests/apps/fastfold/alphafold_reference.py
// wrote them; tests/apps/fastfold/golden/alphafold_tiny/manifest.json records its hash, arguments and
// versions), read once per test binary, and the comparison every FastFold golden test makes.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>

#include <torch/torch.h>

#include "core/io/npz.h"

namespace kuafu::fold::testing {

inline const io::NpzArrays& alphafold_golden(const std::string& file) {
  static std::map<std::string, io::NpzArrays> files;
  auto found = files.find(file);
  if (found == files.end()) {
    const std::filesystem::path dir = std::filesystem::path(KUAFU_SOURCE_DIR) / "tests/apps/fastfold/golden/alphafold_tiny";
    found = files.emplace(file, io::read_npz((dir / file).string())).first;
  }
  return found->second;
}

// The .npz key of a module's parameter: "<module path>[/<scope>]//<name>" for the torch name "[scope.]name".
inline std::string alphafold_key(const std::string& module_path, const std::string& parameter) {
  const size_t last = parameter.rfind('.');
  std::string scope = last == std::string::npos ? "" : "/" + parameter.substr(0, last);
  for (char& ch : scope) ch = ch == '.' ? '/' : ch;
  return module_path + scope + "//" + parameter.substr(last == std::string::npos ? 0 : last + 1);
}

// float32 on both sides, summed in other orders: outputs and gradients agree to 1e-5 of their largest
// entry (measured: 1e-7 to 1.3e-6). A gradient that vanishes in exact arithmetic (a bias shifting every
// logit of a row alike, which softmax ignores: the pair-bias LayerNorm's offset, IPA's attention_2d bias)
// is float32 cancellation noise on both sides, up to ~3e-6 here for terms of size ~10: it must stay
// under 1e-5. The measured figures are printed.
inline void expect_like_alphafold(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double scale = expected.abs().max().item<double>();
  const double difference = (actual - expected).abs().max().item<double>();
  std::cout << "  " << what << ": max |difference| " << difference << " of max |value| " << scale << "\n";
  const bool vanishes = scale < 1e-4;
  EXPECT_LE(vanishes ? actual.abs().max().item<double>() : difference, 1e-5 * (vanishes ? 1.0 : scale)) << what;
}

}  // namespace kuafu::fold::testing

// Lazy construction (issue 32, item 3): a GPT described on the meta device holds no storage, and once
// materialised and initialised it is the GPT built eagerly from the same seed, bit for bit: in float32,
// in bf16 (drawn in float32 and cast, as ModelState casts an eager model), and as one pipeline stage
// whose other parts are never given storage. Tensor-parallel blocks of a lazy model are checked by the
// tensor-parallel training tests, which now build lazily against the serial run.
#include <gtest/gtest.h>

#include "apps/gpt/model.h"
#include "core/train/lazy_model.h"
#include "core/train/model_memory.h"
#include "core/train/parallelize.h"
#include "tests/apps/gpt/gpt_tiny_config.h"
#include "tests/apps/gpt/gpt_training_support.h"

namespace kuafu::gpt {
namespace {

GPT eager_gpt() {
  torch::manual_seed(7);
  return GPT(tiny_gpt_config(4));
}

GPT described_gpt() {
  GPT gpt(tiny_gpt_config(4), parallel::ModelOptions(parallel::TensorParallel(), torch::kMeta));
  for (const auto& p : gpt->parameters()) EXPECT_TRUE(p.is_meta());
  return gpt;
}

void initialize(GPT& gpt) {
  torch::manual_seed(7);
  gpt->initialize();
}

TEST(GPTLazyBuildTest, DescribedThenMaterialisedEqualsTheEagerModel) {
  const GPT eager = eager_gpt();
  GPT lazy = described_gpt();
  train::materialize(*lazy, {torch::kCPU});
  initialize(lazy);
  const auto expected = eager->named_parameters();
  ASSERT_EQ(lazy->named_parameters().size(), expected.size());
  for (const auto& item : lazy->named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), torch::kFloat32) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), expected[item.key()])) << item.key();
  }
}

TEST(GPTLazyBuildTest, MaterialisedInBf16EqualsTheEagerModelCast) {
  const GPT eager = eager_gpt();
  GPT lazy = described_gpt();
  train::materialize(*lazy, {torch::kCPU, [](const std::string&) { return torch::kBFloat16; }});
  initialize(lazy);
  const auto expected = eager->named_parameters();
  for (const auto& item : lazy->named_parameters()) {
    EXPECT_EQ(item.value().scalar_type(), torch::kBFloat16) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), expected[item.key()].to(torch::kBFloat16))) << item.key();
  }
}

// The second of two stages holds blocks 2 and 3 and the tail (final norm and the tied embedding): only
// those get storage, and they equal the eager model's, although the first stage's parameters come
// before them in the generator's order (they are drawn and dropped).
TEST(GPTLazyBuildTest, OneStageHoldsOnlyItsPartsAndTheyEqualTheEagerOnes) {
  const GPT eager = eager_gpt();
  GPT lazy = described_gpt();
  const parallel::pipeline::StagePlan second{{{2, 4}}, /*first=*/false, /*last=*/true};
  const train::StageParts parts = train::stage_parts(*lazy, second);
  train::materialize(*lazy, {torch::kCPU, nullptr, [&](const std::string& name) { return parts.holds(name); }});
  initialize(lazy);
  const auto expected = eager->named_parameters();
  int64_t held = 0, left = 0;
  for (const auto& item : lazy->named_parameters()) {
    const std::string& name = item.key();
    const bool holds = name.rfind("transformer.h.2.", 0) == 0 || name.rfind("transformer.h.3.", 0) == 0 ||
                       name.rfind("transformer.ln_f.", 0) == 0 || name == "transformer.wte.weight";
    EXPECT_EQ(parts.holds(name), holds) << name;
    if (holds) {
      EXPECT_TRUE(torch::equal(item.value(), expected[name])) << name;
      held += item.value().numel();
    } else {
      EXPECT_TRUE(item.value().is_meta()) << name;
      left += item.value().numel();
    }
  }
  EXPECT_GT(held, 0);
  EXPECT_GT(left, 0);
}

// A "measured" pipeline partition times the head, a block and the tail of a model not yet materialised
// on zeros, then returns them to the meta device.
TEST(GPTLazyBuildTest, MeasuredPartitionTimesADescribedModelAndLeavesItDescribed) {
  GPT lazy = described_gpt();
  const train::Batch sample{torch::randint(50, {2, 16}), torch::randint(50, {2, 16})};
  const parallel::pipeline::StageCosts costs = train::measured_costs(*lazy, sample);
  EXPECT_GT(costs.block, 0.0);
  EXPECT_GT(costs.head, 0.0);
  EXPECT_GT(costs.tail, 0.0);
  for (const auto& item : lazy->named_parameters()) EXPECT_TRUE(item.value().is_meta()) << item.key();
}

// Before: the fit check counted masters, gradients and optimizer state for every parameter, so a LoRA
// run of a model whose frozen bf16 weights fit was refused (OPT-1.3b needed "22.1 GiB").
TEST(GPTLazyBuildTest, FrozenParametersCostOnlyTheirComputeBytesInTheFitCheck) {
  const fs::path root = temp_dir("fit_frozen");
  const config::Config config = make_config(root, "run", "precision.dtype=\"bf16\"");
  auto runtime = single_runtime();
  const double parameters = 1e9;
  // bf16 weights and float32 gradients, masters and two Adam moments: 2 + 4 + 4 + 8 bytes.
  EXPECT_DOUBLE_EQ(train::least_training_bytes(config, runtime, parameters), parameters * 18);
  EXPECT_DOUBLE_EQ(train::least_training_bytes(config, runtime, parameters, parameters), parameters * 2);
  EXPECT_DOUBLE_EQ(train::least_training_bytes(config, runtime, parameters, parameters / 2), parameters / 2 * 20);
}

}  // namespace
}  // namespace kuafu::gpt

// Lazy construction (issue 32, item 3): a GPT described on the meta device holds no storage, and once
// materialised and initialised it is the GPT built eagerly from the same seed, bit for bit: in float32,
// in bf16 (drawn in float32 and cast, as ModelState casts an eager model), and as one pipeline stage
// whose other parts are never given storage. Under ZeRO and Gemini the trained weights are never
// materialised: the strategy fills its chunks as the values are drawn (and read from model.init_from),
// and its masters and compute weights equal those it makes from the eager model. Tensor-parallel blocks
// of a lazy model are checked by the tensor-parallel training tests, which build lazily against the
// serial run (under ZeRO and Gemini too).
#include <gtest/gtest.h>

#include "apps/gpt/hugging_face.h"
#include "apps/gpt/model.h"
#include "apps/gpt/task.h"
#include "core/memory/gemini.h"
#include "core/memory/zero.h"
#include "core/train/lazy_model.h"
#include "core/train/model_memory.h"
#include "core/train/parallelize.h"
#include "tests/apps/gpt/gpt_tiny_config.h"
#include "tests/apps/gpt/gpt_training_support.h"
#include "tests/support/test_util.h"

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

// A model owns its block sites: its head, blocks and tail without a ParallelModel (so a model run whole,
// a frozen reference, takes strategies as it is), and a stage's parts once one keeps them.
TEST(GPTLazyBuildTest, ItsBlockSitesAreItsPartsUntilAStageKeepsSome) {
  GPT gpt = described_gpt();
  std::vector<std::string> parts = {gpt->head_part().name};
  for (int64_t i = 0; i < 4; ++i) parts.push_back(gpt->block_part(i).name);
  parts.push_back(gpt->tail_part().name);
  EXPECT_EQ(gpt->block_sites().names(), parts);
  gpt->use_parts(/*first=*/false, /*last=*/true, [](int64_t block) { return block >= 2; });
  EXPECT_EQ(gpt->block_sites().names(), std::vector<std::string>(parts.begin() + 3, parts.end()));
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
  // A moving average of the weights is one more float32 tensor beside each master (it was left out).
  const config::Config averaged = make_config(root, "averaged", "precision.dtype=\"bf16\"\noptim.ema_decay=0.99");
  EXPECT_DOUBLE_EQ(train::least_training_bytes(averaged, runtime, parameters), parameters * 22);
  EXPECT_DOUBLE_EQ(train::least_training_bytes(averaged, runtime, parameters, parameters / 2), parameters / 2 * 24);
}

// The same strategy made from the eager GPT and from a described one that its DeferredWeights fill.
struct StrategyPair {
  GPT eager, lazy;
  std::unique_ptr<memory::ChunkedMasters> from_eager, from_lazy;
};

DeferredWeights replayed_init() {
  return {torch::kCPU, [] {
            GPT fresh = described_gpt();
            initialize(fresh);
          }};
}

StrategyPair make_pair(const std::string& strategy, torch::Dtype dtype, DeferredWeights deferred) {
  StrategyPair pair{eager_gpt(), described_gpt(), nullptr, nullptr};
  auto make = [&](GPT& gpt, DeferredWeights weights) -> std::unique_ptr<memory::ChunkedMasters> {
    const dist::GroupPtr group = dist::World::single()->world_group();
    const optim::GradReduce reduce = optim::GradReduce::kFloat32;
    if (strategy == "gemini") {
      return std::make_unique<memory::Gemini>(*gpt, group, memory::GeminiOptions{0, dtype, {}, reduce, std::move(weights)});
    }
    const int stage = strategy == "zero1" ? 1 : 2;
    return std::make_unique<memory::ZeroRedundancy>(*gpt, group,
                                                    memory::ZeroOptions{stage, 0, dtype, reduce, std::move(weights)});
  };
  pair.from_eager = make(pair.eager, {});
  pair.from_lazy = make(pair.lazy, std::move(deferred));
  return pair;
}

// The chunk-size search gives the tiny GPT at least 8 chunks, so values arrive for several chunks in
// another order than the layout's (ZeRO lays chunks out in reverse). One rank: Gemini keeps each chunk
// gathered (its compute shard is the chunk), so the model's weights are readable.
TEST(GPTLazyBuildTest, ShardedStrategiesFillTheirChunksFromADescribedModelAsFromTheEagerOne) {
  for (const auto& [strategy, dtype] : std::vector<std::pair<std::string, torch::Dtype>>{
           {"zero1", torch::kFloat32}, {"zero2", torch::kBFloat16}, {"gemini", torch::kBFloat16}, {"gemini", torch::kFloat32}}) {
    SCOPED_TRACE(strategy + " " + std::string(c10::toString(dtype)));
    StrategyPair pair = make_pair(strategy, dtype, replayed_init());
    ASSERT_GT(pair.from_lazy->layout().num_chunks(), 4);
    const auto& expected = pair.from_eager->params();
    const auto& got = pair.from_lazy->params();
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) {  // the float32 masters
      EXPECT_EQ(got[i].name, expected[i].name);
      EXPECT_TRUE(torch::equal(got[i].tensor, expected[i].tensor)) << got[i].name;
    }
    const auto eager_weights = pair.eager->named_parameters();
    for (const auto& item : pair.lazy->named_parameters()) {  // the compute weights
      ASSERT_FALSE(item.value().is_meta()) << item.key();
      EXPECT_EQ(item.value().scalar_type(), dtype) << item.key();
      EXPECT_TRUE(torch::equal(item.value(), eager_weights[item.key()])) << item.key();
    }
  }
}

// A model whose initialisation forgets a parameter, or delivers one twice, is refused by name.
TEST(GPTLazyBuildTest, DeferredWeightsThatMissOrRepeatAParameterAreRefused) {
  const std::string missing = testing::error_message([] {
    make_pair("zero2", torch::kFloat32, {torch::kCPU, [] {
                                           GPT fresh = described_gpt();
                                           const WeightSink* sink = current_weight_sink();
                                           for (const auto& item : fresh->named_parameters()) {
                                             if (item.key() == "transformer.h.1.mlp.c_fc.weight") continue;
                                             sink->take(item.key(), torch::zeros(item.value().sizes()));
                                           }
                                         }});
  });
  EXPECT_NE(missing.find("'transformer.h.1.mlp.c_fc.weight' got no initial value"), std::string::npos) << missing;
  const std::string twice = testing::error_message([] {
    make_pair("gemini", torch::kFloat32, {torch::kCPU, [] {
                                            GPT fresh = described_gpt();
                                            initialize(fresh);
                                            current_weight_sink()->take("transformer.wpe.weight",
                                                                        torch::zeros({16, 32}));
                                          }});
  });
  EXPECT_NE(twice.find("'transformer.wpe.weight' was given its initial value twice"), std::string::npos) << twice;
}

class GPTLazyTrainingTest : public GPTTrainingTest {};

// model.init_from under 1D tensor x data parallelism and ZeRO-2 (2 x 2 ranks): the task leaves the model
// described, and the chunks take the drawn weights, then each rank's blocks of the folder's tensors,
// one stored tensor at a time. The weights the ranks hold, gathered over the tensor group, are the
// folder's exactly (float32 throughout).
TEST_F(GPTLazyTrainingTest, InitFromUnderTensorTimesDataParallelZero2FillsTheChunksFromTheFolder) {
  if (!testing::is_worker()) {
    const config::Config shape = make_config(root_, "unused", "");
    torch::manual_seed(99);  // not train.seed: the folder's weights are not the run's own draws
    GPT source(model_config(shape));
    gpt_format().save(source, (root_ / "hf").string());
    return testing::run_test_on_ranks(4, 120);
  }
  const auto config = make_config(root_, "run", "parallel.tensor.mode=\"1d\"\nparallel.tensor.size=2\n"
                                                "train.micro_batch_size=4\nmemory.strategy=\"zero2\"\n"
                                                "dist.timeout_s=30\nmodel.init_from=\"" + (root_ / "hf").string() + "\"");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config, runtime);
  for (const auto& p : task->model().parameters()) EXPECT_TRUE(p.is_meta());
  train::Trainer trainer(config, runtime, *task);
  GPT& model = task->model_holder();
  const auto layouts = parallel::collect_layouts(*model);
  const GPT stored = gpt_format().load((root_ / "hf").string());
  const auto expected = stored->named_parameters();
  for (const auto& item : model->named_parameters()) {
    const auto found = layouts.find(item.key());
    const torch::Tensor whole = found == layouts.end()
                                    ? item.value().detach()
                                    : parallel::gather_full(item.value().detach(), found->second, *model->tp.mesh);
    EXPECT_TRUE(torch::equal(whole, expected[item.key()])) << item.key();
  }
}

}  // namespace
}  // namespace kuafu::gpt

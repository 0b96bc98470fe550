// Strategies applied by module to models of any shape (hooks::BlockSites): blocks that take and return
// several tensors get one pre/post backward each, checkpoint with several inputs and outputs, and the
// test-only UNet-shaped and two-stream models (tests/support/site_models.h) train under activation
// checkpointing, data parallelism, ZeRO-2 and Gemini on 2 Gloo ranks with the serial run's gradients,
// and Gemini's auto placement, alone and under a device budget that forces evictions, equals its static
// placement (bf16, bitwise).
//
// Gradients are compared, not weights after an adaptive step: the runs use plain SGD (lr 0.1, no
// momentum, decay or clipping) in float64 (precision.dtype = "fp64"), so step s's gradient is
// (w[s-1] - w[s]) / lr, read from a checkpoint after every step. Tolerance 1e-10 of the largest gradient
// (at least 1): float64 sums in another order (2 ranks, chunked reductions) differ by ~1e-16 relative,
// and recovering a gradient from two weights costs ~1e-15; a wrong gradient is off by far more.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <type_traits>

#include "core/dist/collectives.h"
#include "core/memory/activation_checkpoint.h"
#include "core/train/checkpoint.h"
#include "core/train/parallelize.h"
#include "core/train/trainer.h"
#include "tests/support/multiprocess.h"
#include "tests/support/site_models.h"
#include "tests/support/test_util.h"
#include "tests/support/training_runs.h"
#include "tests/support/worker_world.h"

namespace kuafu::train {
namespace {
namespace fs = std::filesystem;
using hooks::Tensors;

// Counts the hook calls per block.
struct CountingHooks : hooks::BlockHooks {
  std::map<std::string, std::array<int, 4>> calls;  // pre/post forward, pre/post backward
  void pre_forward(const hooks::BlockCall& c) override { ++calls[c.name][0]; }
  void post_forward(const hooks::BlockCall& c) override { ++calls[c.name][1]; }
  void pre_backward(const hooks::BlockCall& c) override { ++calls[c.name][2]; }
  void post_backward(const hooks::BlockCall& c) override { ++calls[c.name][3]; }
};

std::map<std::string, torch::Tensor> gradients_of(torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& item : model.named_parameters()) {
    grads[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : torch::zeros_like(item.value());
  }
  return grads;
}

using testing::expect_same_gradients;

TEST(BlockStrategiesTest, ABlockOfSeveralTensorsHasOneBackwardBracket) {
  torch::nn::Linear a(3, 3), b(3, 3);
  a->to(torch::kFloat64);
  b->to(torch::kFloat64);
  hooks::BlockSites sites;
  sites.add({"pair", {a.get(), b.get()}});
  CountingHooks counting;
  torch::nn::Module root;
  root.register_module("a", a);
  root.register_module("b", b);
  sites.set_hooks(&counting, root);
  const torch::Tensor x = torch::randn({2, 3}, torch::kFloat64).requires_grad_(true);
  const torch::Tensor y = torch::randn({2, 3}, torch::kFloat64).requires_grad_(true);
  const torch::Tensor ids = torch::arange(2);
  const Tensors out = sites.call("pair", {x, y, ids, torch::Tensor()}, [&](const Tensors& in) {
    EXPECT_FALSE(in[3].defined()) << "an absent input stays absent";
    EXPECT_TRUE(torch::equal(in[2], ids)) << "ids pass as they are";
    return Tensors{a->forward(in[0]) * b->forward(in[1]), b->forward(in[0]), in[2]};
  });
  ASSERT_EQ(out.size(), 3u);
  (out[0].sum() + out[1].pow(2).sum()).backward();
  EXPECT_EQ(counting.calls["pair"], (std::array<int, 4>{1, 1, 1, 1}));
  // The same gradients as the block without hooks.
  const torch::Tensor gx = x.grad().clone(), gy = y.grad().clone();
  x.mutable_grad() = torch::Tensor();
  y.mutable_grad() = torch::Tensor();
  (a(x) * b(y)).sum().add(b(x).pow(2).sum()).backward();
  EXPECT_TRUE(torch::allclose(gx, x.grad(), 0, 1e-14));
  EXPECT_TRUE(torch::allclose(gy, y.grad(), 0, 1e-14));
}

TEST(BlockStrategiesTest, CheckpointingSeveralTensorsEqualsThePlainBlock) {
  torch::nn::Linear a(4, 4);
  a->to(torch::kFloat64);
  // Two inputs (one needs no gradient), a mask that is absent, three outputs: one unused, one the
  // input itself, and dropout whose mask the recomputation must repeat.
  auto body = [a](const Tensors& in) mutable {
    torch::Tensor h = torch::dropout(a->forward(in[0]).tanh(), 0.5, /*train=*/true) * in[1];
    return Tensors{h, h.exp(), in[0]};
  };
  auto run = [&](bool checkpoint) {
    a->zero_grad();
    torch::manual_seed(3);
    const torch::Tensor x = torch::linspace(-1, 1, 8, torch::kFloat64).view({2, 4}).requires_grad_(true);
    const torch::Tensor scale = torch::full({2, 4}, 1.5, torch::kFloat64);
    const Tensors inputs{x, scale, torch::Tensor()};
    const Tensors out = checkpoint ? memory::checkpointed(inputs, body) : body(inputs);
    (out[0].pow(2).sum() + 3 * out[2].sum()).backward();
    auto grads = gradients_of(*a);
    grads["x"] = x.grad().clone();
    return grads;
  };
  expect_same_gradients(run(true), run(false), 0, "checkpointed");
}

template <typename Model, typename Batch>
std::map<std::string, torch::Tensor> model_gradients(Model& model, const Batch& batch) {
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  model->loss(batch).backward();
  return gradients_of(*model);
}

TEST(BlockStrategiesTest, CheckpointingByPatternRecomputesOnlyThoseBlocks) {
  torch::manual_seed(1);
  testing::UNetToy unet;
  const testing::UNetBatch batch = testing::unet_data(4);
  const auto plain = model_gradients(unet, batch);
  memory::checkpoint_blocks(unet->sites, {"down_blocks.*", "mid_block"});
  // A counter inside the checkpointing: a checkpointed block's body runs twice a step, the others once.
  std::map<std::string, int> runs;
  for (const auto& name : unet->sites.names()) {
    unet->sites.wrap(name, [&runs](const hooks::BlockCall& call, const Tensors& in, const hooks::BlockBody& next) {
      ++runs[call.name];
      return next(in);
    });
  }
  expect_same_gradients(model_gradients(unet, batch), plain, 1e-14, "checkpointed down and mid blocks");
  EXPECT_EQ(runs["down_blocks.0"], 2);
  EXPECT_EQ(runs["down_blocks.1"], 2);
  EXPECT_EQ(runs["mid_block"], 2);
  EXPECT_EQ(runs["up_blocks.0"], 1);
  EXPECT_EQ(runs["conv_in"], 1);
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { memory::checkpoint_blocks(unet->sites, {"encoder.*"}); }),
                           "no block of the model matches \"encoder.*\""));
}

TEST(BlockStrategiesTest, HooksNeedEveryParameterInABlock) {
  torch::manual_seed(1);
  testing::TwoStreamToy toy(nullptr, /*depth=*/3);
  hooks::BlockSites partial(*toy, {"embed", "blocks.0", "blocks.1", "blocks.2"});
  CountingHooks counting;
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { partial.set_hooks(&counting, *toy); }),
                           "parameter head.residue.weight lies in none of the model's blocks"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { hooks::BlockSites(*toy, {"embed", "trunk"}); }),
                           "the model names block trunk, which is no submodule of it"));
}

// ---- Training under the strategies, 2 Gloo ranks against the serial run ----

constexpr int kSteps = 3;
constexpr double kLr = 0.1;

fs::path run_root() { return testing::shared_test_dir("block_strategies"); }

config::Config run_config(const std::string& name, const std::string& extra) {
  return testing::sgd_float64_config(run_root() / name, kSteps, kLr, 8, extra);
}

// A model of the general form with 64 fixed rows: step s trains on rows [8 s, 8 s + 8) (mod 64).
template <typename Model, typename Batch>
struct SiteTask : TrainTask {
  SiteTask(Model model, Batch data) : net(std::move(model)), data(std::move(data)) {}
  torch::nn::Module& model() override { return *net; }
  torch::Tensor loss(int64_t step, int64_t first_row, int64_t rows) override {
    return net->loss(data.rows((8 * step + first_row) % 64, rows).to(dtype()));
  }
  torch::Dtype dtype() { return net->parameters().front().scalar_type(); }  // bf16 under precision.dtype = "bf16"
  LossSum evaluate(int rank, int ranks) override {
    torch::NoGradGuard no_grad;
    const int64_t rows = 8 / ranks;
    const double loss = net->loss(data.rows(rank * rows, rows).to(dtype())).template item<double>();
    return {loss * static_cast<double>(rows), static_cast<double>(rows), 0, {}};
  }
  double flops_per_item() const override { return 1.0; }
  int64_t items_per_row() const override { return 1; }
  std::vector<std::string> checkpoint_keys() const override { return {}; }
  bool set_block_hooks(hooks::BlockHooks* hooks) override {
    net->set_block_hooks(hooks);
    return true;
  }
  Model net;
  Batch data;
};

// The strategy runs: name, overrides, ranks. Each equals the serial run but the bf16 pair, which
// equal each other (below).
struct StrategyRun {
  std::string name, overrides;
  int ranks;
};
const std::vector<StrategyRun> kRuns = {
    {"checkpointed", "memory.activation_checkpointing=true", 1},
    {"data", "train.micro_batch_size=4", 2},
    {"zero2", "train.micro_batch_size=4\nmemory.strategy=\"zero2\"", 2},
    {"gemini", "train.micro_batch_size=4\nmemory.strategy=\"gemini\"\nmemory.chunk_mb=0.03\n"
               "memory.activation_checkpointing=true", 2},
    // Gemini places chunks only when the compute dtype is below the masters' (in float32 or float64 the
    // compute shards are the masters), so placement runs in bf16: one row per micro-step (4
    // accumulated), chunks of ~16k elements. Placement moves data, not arithmetic: auto placement (kept
    // and prefetched by the warm-up's trace) and auto placement under a device budget that forces
    // evictions (gemini_budget_bf16, run after these with a budget from gemini_auto_bf16's figures)
    // equal static placement in bf16 bitwise.
    {"gemini_static_bf16", "train.micro_batch_size=1\nmemory.strategy=\"gemini\"\nmemory.chunk_mb=0.03\n"
                           "memory.activation_checkpointing=true\nprecision.dtype=\"bf16\"", 2},
    {"gemini_auto_bf16", "train.micro_batch_size=1\nmemory.strategy=\"gemini\"\nmemory.chunk_mb=0.03\n"
                         "memory.activation_checkpointing=true\nprecision.dtype=\"bf16\"\n"
                         "memory.placement=\"auto\"", 2},
};

// The model as the run's layout asks: the two-stream model's blocks take the dap group.
template <typename Model>
Model make_model(const Runtime& runtime) {
  if constexpr (std::is_same_v<Model, testing::TwoStreamToy>) {
    return Model(runtime.dap);
  } else {
    return Model();
  }
}

const std::string kBudgetRun = "gemini_budget_bf16";

// The budget run's device budget: what gemini_auto_bf16 used at its peak (activations, every chunk
// kept, the gradients of the blocks in backward) less a quarter of its chunks. That holds any one block
// (the largest takes ~0.9 MiB in backward with its gradients and the chunks it shares with neighbours),
// but not every chunk, so chunks are evicted every micro-step. The activations measured on the CPU (the
// heap, shared with Gloo's threads) differ by up to ~0.3 MiB between runs; both margins are larger.
double budget_mb(const std::string& prefix) {
  const auto lines = testing::metric_lines(run_root() / (prefix + "gemini_auto_bf16") / "metrics.jsonl");
  if (lines.empty()) return 0;
  return lines.back().value("device_peak_mb", 0.0) - 0.25 * lines.back().value("chunks_mb", 0.0);
}

template <typename Model, typename Batch>
void train_model(const std::string& prefix, const std::string& name, const std::string& overrides,
                 const std::shared_ptr<dist::World>& world, const std::vector<std::string>& checkpoint_defaults,
                 const Batch& data) {
  const config::Config config = run_config(prefix + name, overrides);
  Runtime runtime = start_runtime(config, world);
  torch::manual_seed(1);
  SiteTask<Model, Batch> task(make_model<Model>(runtime), data);
  checkpoint_from_config(config, task.net->sites, checkpoint_defaults);
  Trainer(config, runtime, task).run();
}

// Step s's gradients of run `name`: (w[s-1] - w[s]) / lr, w[0] the seeded initial weights.
std::vector<std::map<std::string, torch::Tensor>> step_gradients(const std::string& name, torch::nn::Module& initial) {
  return testing::sgd_step_gradients(run_root() / name, initial, kSteps, kLr);
}

template <typename Model>
void expect_runs_equal_serial(const std::string& prefix) {
  torch::manual_seed(1);
  Model initial;
  const auto serial = step_gradients(prefix + "serial", *initial);
  for (const auto& run : kRuns) {
    if (run.name.find("bf16") != std::string::npos) continue;
    const auto actual = step_gradients(prefix + run.name, *initial);
    for (int s = 0; s < kSteps; ++s) {
      expect_same_gradients(actual[s], serial[s], 1e-10, prefix + run.name + " step " + std::to_string(s + 1));
    }
  }
  // bf16: the model starts from the float32 masters' bf16 copy, so the weights before step 1 are the
  // same in both runs; auto placement (evicting, prefetching, stepping masters where they live) equals
  // static placement bitwise.
  const auto placed_static = step_gradients(prefix + "gemini_static_bf16", *initial);
  const auto placed_auto = step_gradients(prefix + "gemini_auto_bf16", *initial);
  for (int s = 0; s < kSteps; ++s) {
    expect_same_gradients(placed_auto[s], placed_static[s], 0, prefix + "bf16 auto vs static, step " + std::to_string(s + 1));
  }
  // Auto placement kept chunks gathered and fetched the next block's ahead.
  const auto lines = testing::metric_lines(run_root() / (prefix + "gemini_auto_bf16") / "metrics.jsonl");
  ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps));
  EXPECT_GT(lines.back().value("prefetches", 0.0), 0.0) << lines.back().dump();
  // Under the budget it evicted chunks, stayed within the budget, and took the same steps.
  const double budget = budget_mb(prefix);
  ASSERT_LT(budget, lines.back().value("device_peak_mb", 0.0)) << "the budget would not force evictions";
  const auto budget_lines = testing::metric_lines(run_root() / (prefix + kBudgetRun) / "metrics.jsonl");
  ASSERT_EQ(budget_lines.size(), static_cast<size_t>(kSteps));
  EXPECT_GT(budget_lines.back().value("evictions", 0.0), 0.0) << budget_lines.back().dump();
  EXPECT_LE(budget_lines.back().value("device_peak_mb", 1e9), budget) << budget_lines.back().dump();
  const auto evicting = step_gradients(prefix + kBudgetRun, *initial);
  for (int s = 0; s < kSteps; ++s) {
    expect_same_gradients(evicting[s], placed_static[s], 0, prefix + "bf16 budget vs static, step " + std::to_string(s + 1));
  }
}

template <typename Model, typename Batch>
void run_strategies(const std::string& prefix, const std::vector<std::string>& checkpoint_defaults, const Batch& data) {
  if (!testing::is_worker()) {
    for (const auto& name : {std::string("serial"), std::string("checkpointed")}) {
      fs::remove_all(run_root() / (prefix + name));
    }
    train_model<Model>(prefix, "serial", "", dist::World::single(), checkpoint_defaults, data);
    train_model<Model>(prefix, "checkpointed", kRuns[0].overrides, dist::World::single(), checkpoint_defaults, data);
    testing::run_test_on_ranks(2, 120);
    expect_runs_equal_serial<Model>(prefix);
    fs::remove_all(run_root());  // about 200 MB of checkpoints
    return;
  }
  auto world = testing::worker_world();
  for (const auto& run : kRuns) {
    if (run.ranks == 2) train_model<Model>(prefix, run.name, run.overrides, world, checkpoint_defaults, data);
  }
  dist::barrier(*world->world_group());  // gemini_auto_bf16's metrics are written
  const std::string auto_run = kRuns.back().overrides;
  train_model<Model>(prefix, kBudgetRun, auto_run + "\nmemory.device_budget_mb=" + std::to_string(budget_mb(prefix)), world,
                     checkpoint_defaults, data);
}

TEST(BlockStrategiesTest, AUNetShapedModelTrainsUnderEveryStrategyWithTheSerialGradients) {
  run_strategies<testing::UNetToy>("unet_", {"down_blocks.*", "mid_block", "up_blocks.*"}, testing::unet_data(64));
}

TEST(BlockStrategiesTest, ATwoStreamModelTrainsUnderEveryStrategyWithTheSerialGradients) {
  run_strategies<testing::TwoStreamToy>("two_stream_", {"blocks.*"}, testing::two_stream_data(64));
}

// FastFold's dynamic axial parallelism from the config: parallel.dap.size = 2 next to 2 data ranks (4
// processes). Each dap rank holds half of every sample's residues (the MSA's columns, the pair's rows),
// the outer product gathers the other half, and each rank's loss is the mean over its residues; the
// gradients averaged over the data and dap ranks are the serial run's (float64, 1e-10 as above).
TEST(BlockStrategiesTest, ATwoStreamModelSplitOverADapAxisGivesTheSerialGradients) {
  const auto data = testing::two_stream_data(64);
  const std::string overrides = "train.micro_batch_size=4\nparallel.dap.size=2";
  if (!testing::is_worker()) {
    fs::remove_all(run_root() / "dap_serial");
    train_model<testing::TwoStreamToy>("dap_", "serial", "", dist::World::single(), {}, data);
    testing::run_test_on_ranks(4, 120);
    torch::manual_seed(1);
    testing::TwoStreamToy initial;
    const auto serial = step_gradients("dap_serial", *initial);
    const auto split = step_gradients("dap_split", *initial);
    for (int s = 0; s < kSteps; ++s) {
      expect_same_gradients(split[s], serial[s], 1e-10, "dap step " + std::to_string(s + 1));
    }
    fs::remove_all(run_root());
    return;
  }
  auto world = testing::worker_world();
  train_model<testing::TwoStreamToy>("dap_", "split", overrides, world, {}, data);
  // The run's mesh: data 2 x dap 2, the model's blocks on the dap axis.
  const config::Config config = run_config("dap_mesh", overrides);
  const Runtime runtime = start_runtime(config, world);
  ASSERT_TRUE(runtime.dap);
  EXPECT_EQ(runtime.dap->size(), 2);
  EXPECT_EQ(runtime.mesh->size("data"), 2);
  EXPECT_EQ(runtime.replica_group()->size(), 4);
}

}  // namespace
}  // namespace kuafu::train

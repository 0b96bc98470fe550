// kuafu-fold's model recipe: AlphaFold described on the meta device is drawn and loaded into a weight sink
// with exactly the eager model's values, and `kuafu-fold train` under ZeRO-2 and Gemini (which leave it
// described and fill their chunks from those draws) starts where the eager run starts and takes its steps.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "apps/fastfold/alphafold_model.h"
#include "apps/fastfold/fold_settings.h"
#include "apps/fastfold/fold_task.h"
#include "core/util/weight_sink.h"
#include "tests/apps/fastfold/alphafold_golden.h"
#include "tests/support/json_lines.h"
#include "tests/support/run_command.h"
#include "tests/support/test_util.h"
#include "tests/support/training_runs.h"

namespace kuafu::fold {
namespace {
namespace fs = std::filesystem;

using Values = std::map<std::string, torch::Tensor>;

// What a sharded strategy would receive from a model described on the meta device while `body` runs.
Values sunk_values(const std::function<void()>& body) {
  Values taken;
  const WeightSink sink{torch::kCPU, [](const std::string&) { return true; },
                        [&](const std::string& name, const torch::Tensor& value) {
                          EXPECT_FALSE(taken.count(name)) << name << " handed over twice";
                          taken[name] = value.clone();
                        }};
  ScopedWeightSink scope(sink);
  body();
  return taken;
}

void expect_equal_values(const Values& sunk, torch::nn::Module& eager, const std::string& what) {
  ASSERT_EQ(sunk.size(), eager.named_parameters().size()) << what;
  for (const auto& item : eager.named_parameters()) {
    ASSERT_TRUE(sunk.count(item.key())) << what << ": " << item.key() << " never handed over";
    EXPECT_TRUE(torch::equal(sunk.at(item.key()), item.value())) << what << ": " << item.key();
  }
}

// Bitwise: the same draws from the same generator in the same order, and the same arrays read.
TEST(FoldModelRecipeTest, ADescribedModelIsDrawnAndLoadedAsTheEagerOne) {
  const AlphaFoldSizes sizes = testing::golden_tiny_sizes();
  AlphaFold eager(sizes), described(sizes, parallel::ModelOptions::serial_on(torch::kMeta));
  for (const auto& p : described->parameters()) ASSERT_TRUE(p.is_meta());
  torch::manual_seed(7);
  initialize_alphafold_weights(*eager);
  const Values drawn = sunk_values([&] {
    torch::manual_seed(7);
    initialize_alphafold_weights(*described);
  });
  expect_equal_values(drawn, *eager, "draws");
  // Every kind of initial value is there: LayerNorm scales at one, IPA's point weights at softplus⁻¹(1),
  // open gates, zero final layers, and draws.
  const auto all_equal = [&](const std::string& name, double expected) {
    return torch::allclose(drawn.at(name), torch::full_like(drawn.at(name), expected), 0, 1e-7);
  };
  const std::string block = "evoformer.evoformer_iteration.0.";
  EXPECT_TRUE(all_equal("structure_module.fold_iteration.invariant_point_attention.trainable_point_weights", 0.5413248546));
  EXPECT_TRUE(all_equal(block + "msa_transition.input_layer_norm.scale", 1));
  EXPECT_TRUE(all_equal(block + "triangle_multiplication_outgoing.left_gate.bias", 1));
  EXPECT_TRUE(all_equal(block + "msa_transition.transition2.weights", 0));
  EXPECT_GT(drawn.at(block + "msa_transition.transition1.weights").std().item<float>(), 0.01);

  // model.init_from's file: arrays of other values than the draws, read into both.
  io::NpzArrays arrays = alphafold_arrays(*eager);
  for (auto& [key, array] : arrays) array = array + 0.01 * torch::randn(array.sizes());
  load_alphafold(*eager, arrays);
  expect_equal_values(sunk_values([&] { load_alphafold(*described, arrays); }), *eager, "loaded");
}

// `kuafu-fold train` for two plain-SGD steps in float64 on four chains of ProMod3's database (16-residue crops,
// two recycling iterations at the second step; the fine-tuning stage's experimentally-resolved head and loss on,
// so its tail output travels through every strategy too): without a memory strategy the model is made eagerly; under
// ZeRO-2 and Gemini it stays described and the strategy fills its chunks from the recipe; on two DAP ranks
// (ZeRO-2) its blocks also run over the DAP group its ModelOptions carry. The evaluation after the last step
// gives every run the eager run's figures (1e-9 relative). Each run's step
// gradients, recovered from its checkpoints against the test's own eager model drawn from train.seed, equal
// the eager run's, and the eager run's first equals the gradient of the step's loss computed here: 1e-10 of the
// largest (float64; only summation orders differ). A draw that differed from the test's would show as a
// gradient error of (w0 - w0') / lr.
TEST(FoldModelRecipeTest, TrainingUnderZeroGeminiAndDapStartsFromTheEagerDrawsAndTakesItsSteps) {
  const fs::path dir = kuafu::testing::temp_dir("fold_model_recipe");
  fs::create_directories(dir / "data/msas");
  std::ofstream(dir / "data/chains.tsv") << "chain_id\tdb_index\tlength\tsplit\tcluster\tgroup\n"
                                         << "A\t100\t0\ttrain\ta\ta\nB\t997\t0\ttrain\tb\tb\nC\t1994\t0\ttrain\tc\tc\n"
                                         << "D\t4915\t0\ttrain\td\td\nE\t300\t0\tval\te\te\n";
  const std::string config = std::string(KUAFU_SOURCE_DIR) + "/apps/fastfold/configs/tiny.toml";
  constexpr int kSteps = 2;
  constexpr double kLr = 0.05;
  const std::vector<std::string> overrides = {
      "data.dir=" + (dir / "data").string(), "data.crop_size=16", "data.max_msa_clusters=4", "data.max_extra_msa=4",
      "data.max_recycles=1", "data.profile_rows=8", "train.steps=" + std::to_string(kSteps), "train.batch_size=2",
      "train.micro_batch_size=1", "train.eval_interval=2", "train.checkpoint_interval=1", "train.keep_checkpoints=4",
      "train.progress=plain", "optim.name=sgd", "optim.momentum=0", "optim.weight_decay=0", "optim.grad_clip=0",
      "optim.lr=" + std::to_string(kLr), "optim.warmup_steps=0", "optim.schedule=constant", "optim.ema_decay=0",
      "precision.dtype=fp64", "model.experimentally_resolved_head=true", "loss.experimentally_resolved=0.01"};
  const auto train = [&](const std::string& name, const std::vector<std::string>& extra, int ranks = 1) {
    std::string command = std::string(KUAFU_FOLD_PATH) + " train --config " + config;
    if (ranks > 1) command = std::string(KUAFU_RUN_PATH) + " --nproc-per-node " + std::to_string(ranks) + " --master-port 0 " + command;
    for (const std::string& o : overrides) command += " --set " + o;
    for (const std::string& o : extra) command += " --set " + o;
    command += " --set train.out_dir=" + (dir / name).string();
    const kuafu::testing::CommandResult result = kuafu::testing::run_command(command);
    EXPECT_EQ(result.exit_code, 0) << name << ":\n" << result.output;
    return result.output;
  };
  train("eager", {});
  train("zero2", {"memory.strategy=zero2"});
  train("gemini", {"memory.strategy=gemini", "memory.chunk_mb=0.05"});
  // Two DAP ranks: the described model takes the run's DAP group from its ModelOptions.
  const std::string dap = train("dap2_zero2", {"memory.strategy=zero2", "parallel.dap.size=2"}, 2);
  EXPECT_NE(dap.find("cut over 2 DAP ranks"), std::string::npos) << dap;

  // The evaluation after step 2 (one validation chain, every recycling iteration): the DAP ranks predict it
  // together and the sums are reduced over data ranks only, so the figures are the serial run's.
  const auto evaluation = [&](const std::string& name) {
    const nlohmann::json last = kuafu::testing::last_line_with(dir / name / "metrics.jsonl", "val_loss");
    EXPECT_FALSE(last.is_null()) << name << " has no evaluation";
    return last;
  };
  const nlohmann::json eager_eval = evaluation("eager");
  for (const std::string name : {"zero2", "gemini", "dap2_zero2"}) {
    const nlohmann::json e = evaluation(name);
    for (const char* figure : {"val_loss", "val_lddt_ca", "val_rmsd_ca"}) {
      const double expected = eager_eval.value(figure, 1.0);
      EXPECT_NEAR(e.value(figure, -1.0), expected, 1e-9 * std::abs(expected)) << name << " " << figure;
    }
  }

  const FoldSettings settings = read_fold_settings(config::Config::load(config, fold_schema(), overrides));
  AlphaFold initial(settings.model);
  torch::manual_seed(0);  // tiny.toml's train.seed
  initialize_alphafold_weights(*initial);
  initial->to(torch::kFloat64);
  const auto eager = kuafu::testing::sgd_step_gradients(dir / "eager", *initial, kSteps, kLr);
  for (const std::string name : {"zero2", "gemini", "dap2_zero2"}) {
    const auto run = kuafu::testing::sgd_step_gradients(dir / name, *initial, kSteps, kLr);
    for (int s = 0; s < kSteps; ++s)
      kuafu::testing::expect_same_gradients(run[s], eager[s], 1e-10, name + " step " + std::to_string(s + 1));
  }
  // The eager run starts from the test's own draws: its first step's gradient is that of the step's loss,
  // computed here on the test's model (the two rows of step 0, mean loss).
  const DatabaseSource db = DatabaseSource::file(kDebianStructureDb);
  FoldTask task(initial, settings, read_prepared_split((dir / "data").string(), "train", db, true), {}, 2, torch::kCPU);
  task.loss(0, 0, 2).backward();
  std::map<std::string, torch::Tensor> reference;
  for (const auto& item : initial->named_parameters())
    reference[item.key()] = item.value().grad().defined() ? item.value().grad() : torch::zeros_like(item.value());
  kuafu::testing::expect_same_gradients(eager[0], reference, 1e-10, "the eager run's first step against the test's");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kuafu::fold

// Dynamic axial parallelism for AlphaFold (FastFold's DAP) over real Gloo ranks, against the serial
// computation in float64:
// - an extra-MSA block and two Evoformer blocks with their MSA, extra MSA and pair cut across 2 and 4 ranks
//   (chunked too) give the serial outputs, and the gradients averaged over the ranks (as the trainer
//   averages them) are the serial gradients of every parameter and input;
// - each rank sends the analytic count of bytes in forward and in backward;
// - padding an example (DAP's sizes must divide by the group) changes no real output, loss or gradient;
// - kuafu-fold's training steps (one without recycling, one with) at DAP 2 x data 2, at DAP 4, and at DAP 2
//   x data 2 under ZeRO-2 and under Gemini with activation checkpointing give every parameter the serial
//   run's gradient.
// Tolerances: 1e-10 of the largest magnitude (at least 1). DAP changes only where sums are cut and in what
// order they add (~1e-16 relative in float64); padding adds exact zeros; recovering a gradient from two
// checkpoints costs ~1e-15. A wrong cut, a lost rank's share or a doubled one is off by O(1).
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include <torch/torch.h>

#include "apps/fastfold/fold_task.h"
#include "core/dist/collectives.h"
#include "core/train/parallelize.h"
#include "core/train/trainer.h"
#include "tests/apps/fastfold/alphafold_golden.h"
#include "tests/support/multiprocess.h"
#include "tests/support/training_runs.h"
#include "tests/support/worker_world.h"

namespace kuafu::fold {
namespace {
namespace fs = std::filesystem;
using Grads = std::map<std::string, torch::Tensor>;

dist::GroupPtr whole_world_dap_group() {
  static auto mesh = [] {
    auto world = kuafu::testing::worker_world();
    return std::make_shared<dist::ProcessMesh>(world, std::vector<dist::MeshAxis>{{"dap", world->size()}});
  }();
  return mesh->group("dap");
}

EvoformerSizes evoformer_stack_sizes() { return {8, 4, 2, 2, 4, 4, 2, false}; }
EvoformerSizes extra_stack_sizes() { return {8, 4, 2, 2, 4, 4, 2, true}; }

// An extra-MSA block then two Evoformer blocks, every parameter drawn at random (AlphaFold's zero-initialised
// output layers would leave most of the maths untested).
struct DapStackImpl : torch::nn::Module {
  DapStackImpl() {
    extra_block = register_module("extra", EvoformerBlock(extra_stack_sizes()));
    for (int b = 0; b < 2; ++b) blocks.push_back(register_module("evoformer" + std::to_string(b), EvoformerBlock(evoformer_stack_sizes())));
    to(torch::kFloat64);
    torch::NoGradGuard no_grad;
    for (auto& p : parameters()) p.normal_(0.0, 0.5);
  }
  // m [S', R, 8], e [E', R, 8], z [R', R, 4] (this rank's rows) -> the same, updated.
  std::vector<torch::Tensor> forward(torch::Tensor m, torch::Tensor e, torch::Tensor z, const torch::Tensor& msa_mask,
                                     const torch::Tensor& extra_mask, const torch::Tensor& pair_mask, int64_t chunk,
                                     const dap::AxialLayout& layout) {
    std::tie(e, z) = extra_block->forward(e, z, extra_mask, pair_mask, chunk, layout);
    for (auto& block : blocks) std::tie(m, z) = block->forward(m, z, msa_mask, pair_mask, chunk, layout);
    return {m, e, z};
  }
  EvoformerBlock extra_block{nullptr};
  std::vector<EvoformerBlock> blocks;
};
TORCH_MODULE(DapStack);

struct StackRun {
  std::vector<torch::Tensor> outputs;  // m, e, z whole
  std::vector<torch::Tensor> inference;  // the same without gradients (inference's in-place path)
  Grads grads;                         // every parameter's and the inputs' ("input.m", ...)
  int64_t forward_bytes = 0, backward_bytes = 0;  // sent by this rank in the stack's forward, in the backward
};

// The stack on inputs drawn from seed 1 (R 8 residues, the last padding; S 4 rows, E 8 extra rows, some
// masked), its loss a fixed random weighting of the whole outputs; under `layout` each rank's gradients are
// averaged over its group.
StackRun run_stack(const dap::AxialLayout& layout, int64_t chunk) {
  torch::manual_seed(1);
  DapStack stack;
  const auto f64 = torch::TensorOptions(torch::kFloat64);
  const int64_t residues = 8, rows = 4, extra_rows = 8;
  std::vector<torch::Tensor> inputs = {torch::randn({rows, residues, 8}, f64), torch::randn({extra_rows, residues, 8}, f64),
                                       torch::randn({residues, residues, 4}, f64)};
  torch::Tensor seq_mask = torch::ones({residues}, f64);
  seq_mask[residues - 1] = 0;
  const torch::Tensor pair_mask = seq_mask.unsqueeze(1) * seq_mask.unsqueeze(0);
  const torch::Tensor msa_mask = (torch::rand({rows, residues}, f64) > 0.2).to(torch::kFloat64) * seq_mask;
  const torch::Tensor extra_mask = (torch::rand({extra_rows, residues}, f64) > 0.3).to(torch::kFloat64) * seq_mask;
  std::vector<torch::Tensor> weights;
  for (const auto& x : inputs) weights.push_back(torch::randn(x.sizes(), f64));
  for (auto& x : inputs) x.requires_grad_(true);

  const auto sent = [&layout] { return layout.serial() ? 0 : layout.group()->counters().bytes_sent; };
  StackRun run;
  std::vector<torch::Tensor> cut;
  for (const auto& x : inputs) cut.push_back(layout.mine(x, 0));
  const int64_t before_forward = sent();
  std::vector<torch::Tensor> out = stack->forward(cut[0], cut[1], cut[2], msa_mask, extra_mask, pair_mask, chunk, layout);
  run.forward_bytes = sent() - before_forward;
  torch::Tensor loss = torch::zeros({}, f64);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = layout.whole(out[i], 0);
    loss = loss + (out[i] * weights[i]).sum();
  }
  const int64_t before_backward = sent();
  loss.backward();
  run.backward_bytes = sent() - before_backward;
  for (const auto& x : out) run.outputs.push_back(x.detach());
  {
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& x : stack->forward(cut[0], cut[1], cut[2], msa_mask, extra_mask, pair_mask, chunk, layout))
      run.inference.push_back(layout.whole(x, 0));
  }
  for (const auto& item : stack->named_parameters()) run.grads[item.key()] = item.value().grad().clone();
  const char* names[] = {"input.m", "input.e", "input.z"};
  for (size_t i = 0; i < inputs.size(); ++i) run.grads[names[i]] = inputs[i].grad().clone();
  if (!layout.serial()) {
    for (auto& [name, g] : run.grads) {
      dist::all_reduce(g, *layout.group());
      g /= static_cast<double>(layout.parts());
    }
  }
  return run;
}

void expect_stack_equals_serial(int64_t chunk) {
  const StackRun serial = run_stack(dap::AxialLayout(), 0);
  const StackRun cut = run_stack(dap::AxialLayout(whole_world_dap_group()), chunk);
  const std::string what = "DAP " + std::to_string(whole_world_dap_group()->size()) + ", chunk " + std::to_string(chunk);
  for (size_t i = 0; i < serial.outputs.size(); ++i) {
    const double scale = std::max(1.0, serial.outputs[i].abs().max().item<double>());
    EXPECT_LE((cut.outputs[i] - serial.outputs[i]).abs().max().item<double>(), 1e-10 * scale) << what << " output " << i;
    EXPECT_LE((cut.inference[i] - serial.outputs[i]).abs().max().item<double>(), 1e-10 * scale) << what << " inference output " << i;
  }
  kuafu::testing::expect_same_gradients(cut.grads, serial.grads, 1e-10, what);
  // The bytes each rank sent are the analytic count: the blocks' in forward; in backward the blocks' again
  // and the final gathers' (each a reduce-scatter sending its (n - 1) / n of the whole gradient).
  const int64_t n = whole_world_dap_group()->size();
  const int64_t blocks = dap_block_sent_elements(extra_stack_sizes(), 8, 8, n) + 2 * dap_block_sent_elements(evoformer_stack_sizes(), 4, 8, n);
  const int64_t final_gathers = (4 * 8 * 8 + 8 * 8 * 8 + 8 * 8 * 4) / n * (n - 1);
  EXPECT_EQ(cut.forward_bytes, 8 * blocks) << what;
  EXPECT_EQ(cut.backward_bytes, 8 * (blocks + final_gathers)) << what;
}

TEST(FoldDapTest, EvoformerStacksEqualSerialOnTwoRanks) {
  if (!kuafu::testing::is_worker()) return kuafu::testing::run_test_on_ranks(2, 120);
  expect_stack_equals_serial(0);
  expect_stack_equals_serial(3);  // each rank's 4 rows in chunks of 3 and 1
}

TEST(FoldDapTest, EvoformerStacksEqualSerialOnFourRanks) {
  if (!kuafu::testing::is_worker()) return kuafu::testing::run_test_on_ranks(4, 120);
  expect_stack_equals_serial(0);
}

// `chains` with random alignments of `rows` rows behind their own sequence (the database keeps none), so
// that the samples have cluster rows and extra rows to cut.
std::vector<FoldChain> with_random_msas(std::vector<FoldChain> chains, int64_t rows) {
  torch::Generator generator = at::detail::createCPUGenerator(11);
  for (FoldChain& chain : chains) {
    const int64_t residues = chain.aatype.size(0);
    torch::Tensor msa = torch::randint(0, 22, {rows, residues}, generator, torch::kInt64);
    msa[0] = chain.aatype;
    chain.msa = {msa, torch::randint(0, 3, {rows, residues}, generator, torch::kInt64).to(torch::kFloat32)};
  }
  return chains;
}

FoldSettings dap_fold_settings() {
  FoldSettings settings;
  settings.model = testing::golden_tiny_sizes();
  settings.crop_size = 16;
  settings.max_recycles = 1;
  settings.sampling = {5, 3};  // 5 cluster rows and 3 extra rows: padded to 6 and 4 under DAP 2, 8 and 4 under DAP 4
  settings.seed = 1;           // step 1 runs one iteration, step 2 two (recycling)
  return settings;
}

// A 21-residue crop with 5 cluster rows and 3 extra rows, padded to multiples of 4: the loss and every gradient
// are the unpadded example's, and so are the real residues' atoms.
TEST(FoldDapTest, PaddingAnExampleChangesNoRealOutput) {
  FoldSettings settings = dap_fold_settings();
  torch::manual_seed(0);
  AlphaFold model(settings.model);
  initialize_alphafold_weights(*model);
  model->to(torch::kFloat64);
  const FoldChain chain = crop_chain(with_random_msas(testing::database_chains(1), 9)[0], 3, 21);
  torch::Generator generator = at::detail::createCPUGenerator(5);
  const FoldExample example = make_example(chain, ideal_residue_geometry(), settings.sampling, 2, 0.9, generator);
  const FoldExample padded = pad_example(example, 4);
  ASSERT_EQ(padded.iterations[0].aatype.size(0), 24);
  ASSERT_EQ(padded.iterations[0].msa_feat.size(0), 8);
  ASSERT_EQ(padded.iterations[0].extra_msa.size(0), 4);
  ASSERT_EQ(padded.labels.structure.backbone.rotation.size(0), 24);
  // example_loss pads by the model's DAP group; serially the padding is made here.
  const auto run = [&](const FoldExample& e, AlphaFoldOutputs& kept) {
    model->zero_grad();
    const torch::Tensor loss = example_loss(*model, e, settings, torch::kCPU, &kept).total;
    loss.backward();
    Grads grads;
    for (const auto& item : model->named_parameters())
      grads[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : torch::zeros_like(item.value());
    grads["loss"] = loss.detach().reshape({1});
    return grads;
  };
  AlphaFoldOutputs plain_out, padded_out;
  const Grads plain = run(example, plain_out), with_padding = run(padded, padded_out);
  kuafu::testing::expect_same_gradients(with_padding, plain, 1e-10, "padded example");
  const torch::Tensor real_atoms = padded_out.first_residues(21).atom37;
  EXPECT_LE((real_atoms - plain_out.atom37).abs().max().item<double>(), 1e-10);
}

// ---- kuafu-fold's training steps over DAP, against the serial run ----

constexpr int kSteps = 2;
constexpr double kLr = 0.05;

fs::path dap_run_root() { return kuafu::testing::shared_test_dir("fold_dap"); }

config::Config dap_run_config(const std::string& name, const std::string& overrides) {
  return kuafu::testing::sgd_float64_config(dap_run_root() / name, kSteps, kLr, 2, overrides);
}

AlphaFold seeded_model(const FoldSettings& settings) {
  torch::manual_seed(3);
  AlphaFold model(settings.model);
  initialize_alphafold_weights(*model);
  // Open every branch AlphaFold's initialisation closes, so every parameter has a gradient to compare.
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.add_(0.05 * torch::randn(p.sizes()));
  model->to(torch::kFloat64);
  return model;
}

void train_fold(const std::string& name, const std::string& overrides, const std::shared_ptr<dist::World>& world) {
  const config::Config config = dap_run_config(name, overrides);
  train::Runtime runtime = train::start_runtime(config, world);
  const FoldSettings settings = dap_fold_settings();
  AlphaFold model = seeded_model(settings);
  model->layout = dap::AxialLayout(runtime.dap);
  FoldTask task(model, settings, with_random_msas(testing::database_chains(4), 9), {}, 2, torch::kCPU,
                train::parallel_options(*model, config, runtime, {}));
  ASSERT_EQ(task.iterations_of(0), 1);
  ASSERT_EQ(task.iterations_of(1), 2);
  train::Trainer(config, runtime, task).run();
}

struct DapRun {
  std::string name, overrides;
};
const std::vector<DapRun> kDapRuns = {
    {"dap2_data2", "train.micro_batch_size=1\nparallel.dap.size=2"},
    {"dap4", "parallel.dap.size=4"},
    {"dap2_zero2", "train.micro_batch_size=1\nparallel.dap.size=2\nmemory.strategy=\"zero2\""},
    {"dap2_gemini", "train.micro_batch_size=1\nparallel.dap.size=2\nmemory.strategy=\"gemini\"\nmemory.chunk_mb=0.02\n"
                    "memory.activation_checkpointing=true"},
};

TEST(FoldDapTest, TrainingStepsOverDapDataZeroAndGeminiGiveTheSerialGradients) {
  if (!kuafu::testing::is_worker()) {
    fs::remove_all(dap_run_root());
    train_fold("serial", "", dist::World::single());
    kuafu::testing::run_test_on_ranks(4, 600);
    AlphaFold initial = seeded_model(dap_fold_settings());
    const auto serial = kuafu::testing::sgd_step_gradients(dap_run_root() / "serial", *initial, kSteps, kLr);
    for (const DapRun& run : kDapRuns) {
      const auto actual = kuafu::testing::sgd_step_gradients(dap_run_root() / run.name, *initial, kSteps, kLr);
      for (int s = 0; s < kSteps; ++s) kuafu::testing::expect_same_gradients(actual[s], serial[s], 1e-10, run.name + " step " + std::to_string(s + 1));
    }
    fs::remove_all(dap_run_root());
    return;
  }
  auto world = kuafu::testing::worker_world();
  for (const DapRun& run : kDapRuns) train_fold(run.name, run.overrides, world);
}

}  // namespace
}  // namespace kuafu::fold

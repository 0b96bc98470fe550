// kuafu-fold on every device the machine has (the CPU, and the first GPU where one is visible): a training
// row through FoldTask (the shared path: named features to the device, ParallelModel's recycling, the losses)
// and a prediction give the CPU's loss, gradients, atoms and pLDDT from the same weights and example. Needs no
// Debian data, so it runs on a GPU machine that has only the test binary and the golden files.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "apps/fastfold/fold_task.h"
#include "apps/fastfold/residue_types.h"
#include "tests/apps/fastfold/alphafold_golden.h"
#include "tests/support/devices.h"

namespace kuafu::fold {
namespace {

// The golden batch's chain (the first 24 residues of the cytochrome d1crj, every heavy atom) with five MSA
// rows: itself and copies with every third residue changed.
FoldChain golden_chain() {
  const io::NpzArrays& golden = testing::alphafold_golden("model.npz");
  FoldChain chain;
  chain.id = "d1crj";
  chain.aatype = golden.at("feat/aatype")[0].to(torch::kInt64);
  chain.residue_index = golden.at("feat/residue_index")[0].to(torch::kInt64);
  chain.positions = golden.at("feat/all_atom_positions")[0].to(torch::kFloat32);
  chain.mask = golden.at("feat/all_atom_mask")[0].to(torch::kFloat32);
  for (int64_t i = 0; i < chain.aatype.size(0); ++i) chain.sequence += residue_types()[chain.aatype[i].item<int64_t>()].code;
  std::vector<torch::Tensor> rows{chain.aatype};
  for (int64_t k = 1; k < 5; ++k) {
    torch::Tensor row = chain.aatype.clone();
    row.slice(0, k % 3, row.size(0), 3).fill_((k * 7) % 20);
    rows.push_back(row);
  }
  chain.msa = {torch::stack(rows), torch::zeros({5, chain.aatype.size(0)})};
  return chain;
}

struct DeviceRun {
  double loss = 0;
  std::map<std::string, torch::Tensor> gradients;  // on the CPU
  torch::Tensor atoms, plddt;                      // the prediction's atom37 [R, 37, 3] and pLDDT [R], on the CPU
};

// One training row (step 3: its recycling count drawn from train.seed) and one prediction with two
// iterations, on `device`, from a copy of `weights`.
DeviceRun run_on(const AlphaFold& weights, const FoldSettings& settings, const torch::Device& device) {
  AlphaFold model(settings.model);
  {
    torch::NoGradGuard no_grad;
    const auto from = weights->named_parameters();
    for (auto& item : model->named_parameters()) item.value().copy_(from[item.key()]);
  }
  model->to(device);
  const FoldChain chain = golden_chain();
  FoldTask task(model, settings, {chain}, {}, 1, device);
  DeviceRun run;
  const torch::Tensor loss = task.loss(3, 0, 1);
  EXPECT_EQ(loss.device(), device);
  loss.backward();
  run.loss = loss.item<double>();
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.value().grad().device(), device) << item.key();
    run.gradients[item.key()] = item.value().grad().cpu();
  }
  model->eval();
  const Prediction p = predict_chain(*model, chain, settings, 2, 0, device);
  run.atoms = p.outputs.atom37.cpu();
  run.plddt = p.plddt.cpu();
  return run;
}

// float32 on both, TF32 off (LibTorch's default): the GPU's kernels sum in other orders, so the loss within
// 1e-4 relative, each gradient within 1e-3 of its largest entry (measured on the CPU against AlphaFold's:
// 2.5e-5; the structure module's frames amplify rounding), atoms within 1e-3 Å and pLDDT within 0.01.
TEST(FoldDeviceTest, EveryDeviceTrainsAndPredictsAsTheCpuDoes) {
  FoldSettings settings;
  settings.model = testing::golden_tiny_sizes();
  settings.crop_size = 24;
  settings.max_recycles = 2;
  settings.sampling = {3, 2};
  torch::manual_seed(0);
  AlphaFold weights(settings.model);
  initialize_alphafold_weights(*weights);
  {
    torch::NoGradGuard no_grad;  // every branch open, so every parameter has a gradient to compare
    for (auto& p : weights->parameters()) p.add_(0.05 * torch::randn(p.sizes()));
  }
  const DeviceRun cpu = run_on(weights, settings, torch::kCPU);
  ASSERT_TRUE(std::isfinite(cpu.loss));
  for (const torch::Device& device : kuafu::testing::devices_to_test()) {
    SCOPED_TRACE(device.str());
    const DeviceRun run = run_on(weights, settings, device);
    EXPECT_NEAR(run.loss, cpu.loss, 1e-4 * std::abs(cpu.loss));
    double worst = 0;
    for (const auto& [key, want] : cpu.gradients) {
      const double scale = want.abs().max().item<double>();
      if (scale > 1e-6) worst = std::max(worst, (run.gradients.at(key) - want).abs().max().item<double>() / scale);
    }
    std::cout << "  " << device << ": loss " << run.loss << " (CPU " << cpu.loss << "), worst relative gradient difference "
              << worst << ", atoms " << (run.atoms - cpu.atoms).abs().max().item<double>() << " Å\n";
    EXPECT_LT(worst, 1e-3);
    EXPECT_LT((run.atoms - cpu.atoms).abs().max().item<double>(), 1e-3);
    EXPECT_LT((run.plddt - cpu.plddt).abs().max().item<double>(), 1e-2);
  }
}

}  // namespace
}  // namespace kuafu::fold

// kuafu-fold's FLOPs count (MFU's numerator) against the matrix products LibTorch's profiler sees.
#include <gtest/gtest.h>

#include <iostream>

#include <torch/torch.h>

#include "apps/fastfold/alphafold_flops.h"
#include "core/train/step_profile.h"
#include "tests/apps/fastfold/alphafold_golden.h"

namespace kuafu::fold {
namespace {

AlphaFoldFeatures random_features(const FoldShape& shape) {
  const int64_t R = shape.residues, S = shape.msa_rows, E = shape.extra_rows;
  return {torch::randint(0, 20, {R}, torch::kInt64), torch::arange(R), torch::ones({R}), torch::rand({R, kTargetFeatures}),
          torch::rand({S, R, kMsaFeatures}), torch::ones({S, R}), torch::randint(0, 23, {E, R}, torch::kInt64),
          torch::zeros({E, R}), torch::zeros({E, R}), torch::ones({E, R})};
}

// One iteration's forward: the count is the profiler's products but the structure module's rigid-body
// 3x3 products (rotations and compositions of frames and points: measured 0.29% of the total
// here), so within 0.5%. Forward and backward of the last iteration: the count's 3x within 5% (a product
// whose one input is a feature or a constant has one gradient product, not two: measured 2.97x).
TEST(AlphaFoldFlopsTest, CountsTheProductsTheProfilerSees) {
  torch::manual_seed(0);
  const FoldShape shape{40, 8, 16};
  AlphaFoldSizes sizes = testing::small_alphafold_sizes();
  sizes.experimentally_resolved_head = true;
  AlphaFold model(sizes);
  const ResidueGeometry geometry = testing::alphafold_residue_geometry();
  const AlphaFoldFeatures features = random_features(shape);
  const Recycled previous = Recycled::zeros(shape.residues, model->sizes, torch::TensorOptions(torch::kFloat32));
  const double counted = alphafold_iteration_flops(model->sizes, shape);
  const double forward = train::profiled_matmul_flops([&] {
    torch::NoGradGuard no_grad;
    model->iteration(features, previous, geometry);
  });
  const double with_backward = train::profiled_matmul_flops([&] {
    const AlphaFoldOutputs out = model->iteration(features, previous, geometry);
    (out.distogram_logits.sum() + out.masked_msa_logits.sum() + out.plddt_logits.sum() + out.experimentally_resolved_logits.sum() +
     out.structure.atom14.sum())
        .backward();
  });
  std::cout << "  counted " << counted << ", profiled forward " << forward << " (" << (forward / counted - 1) * 100
            << "%), forward + backward " << with_backward / counted << "x\n";
  EXPECT_NEAR(forward / counted, 1.0, 5e-3);
  EXPECT_NEAR(with_backward / counted, 3.0, 0.15);
  EXPECT_DOUBLE_EQ(alphafold_training_flops(model->sizes, shape, 2), 4 * counted);
}

}  // namespace
}  // namespace kuafu::fold

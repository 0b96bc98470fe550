// GPT under sequence parallelism (ring, ring self-attention and all-to-all attention, on 2 and 4
// ranks) over real Gloo ranks against the serial GPT from the same seed: each rank computes one chunk
// of the positions, and the mean of the ranks' losses, the mean of their gradients (what data
// parallelism over the sequence ranks applies) and the evaluation sums equal the serial ones.
// float64 (the model is cast after initialisation), tolerance 1e-10: only summation order differs.
#include <gtest/gtest.h>

#include "apps/gpt/model.h"
#include "core/train/parallelize.h"
#include "core/dist/collectives.h"
#include "tests/apps/gpt/gpt_tiny_config.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::gpt {
namespace {

using parallel::sequence::SequenceMode;

void sequence_parallel_gpt_equals_serial(const std::shared_ptr<dist::ProcessMesh>& mesh, SequenceMode mode) {
  parallel::sequence::SequenceParallel sp;
  sp.mode = mode;
  sp.size = mesh->size("sequence");
  sp.group = mesh->group("sequence");
  sp.query_tile = 2;
  const std::string what = "mode " + std::to_string(static_cast<int>(mode)) + ", P = " + std::to_string(sp.size);

  torch::manual_seed(5);
  GPT serial(tiny_parallel_gpt_config());
  torch::manual_seed(5);
  GPT parallel_model(tiny_parallel_gpt_config());
  serial->to(torch::kFloat64);
  parallel_model->to(torch::kFloat64);
  train::ParallelOptions options;
  options.sequence = sp;
  train::ParallelModel runner(*parallel_model, options);

  torch::manual_seed(6);
  const torch::Tensor tokens = torch::randint(64, {3, 12}), targets = torch::randint(64, {3, 12});
  torch::Tensor serial_loss = serial->loss(tokens, targets);
  serial_loss.backward();
  torch::Tensor local_loss = runner.loss({tokens, targets});
  local_loss.backward();
  torch::Tensor mean_loss = local_loss.detach().reshape({1}).clone();
  dist::all_reduce(mean_loss, *sp.group, dist::Reduce::kAvg);
  EXPECT_NEAR(mean_loss.item<double>(), serial_loss.item<double>(), 1e-10) << what;

  const auto expected = serial->named_parameters();
  for (const auto& item : parallel_model->named_parameters()) {
    torch::Tensor grad = item.value().grad().clone();
    dist::all_reduce(grad, *sp.group, dist::Reduce::kAvg);
    EXPECT_TRUE(torch::allclose(grad, expected[item.key()].grad(), 1e-10, 1e-10))
        << what << ": " << item.key() << " gradient differs by " << (grad - expected[item.key()].grad()).abs().max().item<double>();
  }
  const torch::Tensor sums = runner.evaluate({tokens, targets});
  EXPECT_NEAR(sums[0].item<double>() / sums[1].item<double>(), serial_loss.item<double>(), 1e-10) << what;
  EXPECT_EQ(sums[1].item<double>(), static_cast<double>(targets.numel())) << what;
}

void every_mode(int ranks) {
  auto world = testing::worker_world();
  auto mesh = std::make_shared<dist::ProcessMesh>(world, std::vector<dist::MeshAxis>{{"sequence", ranks}});
  for (SequenceMode mode : {SequenceMode::kRing, SequenceMode::kRingScores, SequenceMode::kAllToAll}) {
    sequence_parallel_gpt_equals_serial(mesh, mode);
  }
}

TEST(GPTSequenceParallelTest, EveryModeOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  every_mode(2);
}

TEST(GPTSequenceParallelTest, EveryModeOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  every_mode(4);
}

}  // namespace
}  // namespace kuafu::gpt

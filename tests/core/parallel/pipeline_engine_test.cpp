// The pipeline engine over real Gloo ranks (2 and 4 stages) against the serial model on the same
// micro-batches: every schedule (GPipe, 1F1B, interleaved with 2 chunks per rank) must give each
// rank's blocks exactly the serial gradients of the mean micro-batch loss, and the same loss on every
// rank. float64; the pipeline computes the same products in the same order per micro-batch and sums
// the micro-batches' gradients in schedule order, so they agree to 1e-12.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "core/dist/process_mesh.h"
#include "core/parallel/data/data_parallel.h"
#include "core/parallel/pipeline/engine.h"
#include "core/parallel/pipeline/partition.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::parallel::pipeline {
namespace {

constexpr int kBlocks = 8, kWidth = 6, kRows = 3;

// Block i: x -> tanh(x W_i + b_i); loss of a micro-batch: mean((x_L - y)^2).
struct ToyModel {
  std::vector<torch::Tensor> weights, biases;
  ToyModel() {
    torch::manual_seed(1);
    for (int i = 0; i < kBlocks; ++i) {
      weights.push_back((torch::randn({kWidth, kWidth}, torch::kFloat64) / 2).requires_grad_());
      biases.push_back(torch::randn({kWidth}, torch::kFloat64).requires_grad_());
    }
  }
  torch::Tensor blocks(torch::Tensor x, int begin, int end) const {
    for (int i = begin; i < end; ++i) x = torch::tanh(torch::matmul(x, weights[i]) + biases[i]);
    return x;
  }
};

struct Batch {
  torch::Tensor inputs, targets;  // [m, rows, width]
};

Batch make_batch(int micro_batches) {
  torch::manual_seed(2);
  return {torch::randn({micro_batches, kRows, kWidth}, torch::kFloat64),
          torch::randn({micro_batches, kRows, kWidth}, torch::kFloat64)};
}

// Serial reference: mean over micro-batches of the loss, its gradients.
double serial_step(ToyModel& model, const Batch& batch) {
  torch::Tensor total = torch::zeros({}, torch::kFloat64);
  const int64_t m = batch.inputs.size(0);
  for (int64_t i = 0; i < m; ++i) {
    total = total + (model.blocks(batch.inputs[i], 0, kBlocks) - batch.targets[i]).pow(2).mean();
  }
  total = total / static_cast<double>(m);
  total.backward();
  return total.item<double>();
}

void schedule_equals_serial(const dist::GroupPtr& group, const ScheduleSpec& spec) {
  SCOPED_TRACE(kind_name(spec.kind) + " p=" + std::to_string(spec.stages) + " m=" +
               std::to_string(spec.micro_batches) + " v=" + std::to_string(spec.chunks));
  const Batch batch = make_batch(spec.micro_batches);
  ToyModel serial, piped;
  const double serial_loss = serial_step(serial, batch);

  const int p = spec.stages, s = group->rank(), last = spec.virtual_stages() - 1;
  const std::vector<int> bounds = partition_uniform(kBlocks, spec.virtual_stages());
  PipelineEngine engine(spec, group);
  const double loss = engine.run(
      [&](int chunk, const torch::Tensor& input, int micro) {
        const int v = chunk * p + s;
        torch::Tensor y = piped.blocks(input, bounds[v], bounds[v + 1]);
        return v == last ? (y - batch.targets[micro]).pow(2).mean() : y;
      },
      [&](int micro) { return batch.inputs[micro]; });
  EXPECT_NEAR(loss, serial_loss, 1e-12);

  for (int c = 0; c < spec.chunks; ++c) {
    const int v = c * p + s;
    for (int i = bounds[v]; i < bounds[v + 1]; ++i) {
      ASSERT_TRUE(piped.weights[i].grad().defined()) << "block " << i;
      EXPECT_TRUE(torch::allclose(piped.weights[i].grad(), serial.weights[i].grad(), 1e-12, 1e-12)) << "block " << i;
      EXPECT_TRUE(torch::allclose(piped.biases[i].grad(), serial.biases[i].grad(), 1e-12, 1e-12)) << "block " << i;
    }
  }
  // Blocks of other stages are never touched here.
  int owned = 0;
  for (const auto& w : piped.weights) owned += w.grad().defined() ? 1 : 0;
  EXPECT_EQ(owned * p, kBlocks);
}

void every_schedule_equals_serial() {
  auto world = testing::worker_world();
  auto mesh = std::make_shared<dist::ProcessMesh>(world, std::vector<dist::MeshAxis>{{"pipeline", world->size()}});
  const auto group = mesh->group("pipeline");
  const int p = world->size();
  for (int m : {p - 1, p, 2 * p}) {
    if (m < 1) continue;
    schedule_equals_serial(group, {ScheduleKind::kGPipe, p, m, 1});
    schedule_equals_serial(group, {ScheduleKind::k1F1B, p, m, 1});
  }
  schedule_equals_serial(group, {ScheduleKind::kInterleaved, p, p, 2});
  schedule_equals_serial(group, {ScheduleKind::kInterleaved, p, 2 * p, 2});
}

TEST(PipelineEngineTest, EverySchedulesGradientsEqualSerialOnTwoStages) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  every_schedule_equals_serial();
}

TEST(PipelineEngineTest, EverySchedulesGradientsEqualSerialOnFourStages) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  every_schedule_equals_serial();
}

// pipeline 2 x data 2: each data replica pipelines its own batch; DataParallel (buckets as .grad)
// averages the stage's gradients over the replicas after the schedule, which must equal the serial
// gradient of the mean loss over both replicas' micro-batches.
TEST(PipelineEngineTest, PipelineTimesDataParallelEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  auto world = testing::worker_world();
  auto mesh = std::make_shared<dist::ProcessMesh>(world, std::vector<dist::MeshAxis>{{"pipeline", 2}, {"data", 2}});
  const int s = mesh->coordinate("pipeline"), replica = mesh->coordinate("data");
  const ScheduleSpec spec{ScheduleKind::k1F1B, 2, 4, 1};
  const Batch both = make_batch(2 * spec.micro_batches);  // replica r takes micro-batches r m .. r m + m - 1
  ToyModel serial, piped;
  serial_step(serial, both);

  // The stage's blocks as a module, for DataParallel.
  torch::nn::Module stage;
  for (int i = 4 * s; i < 4 * s + 4; ++i) {
    stage.register_parameter("w" + std::to_string(i), piped.weights[i]);
    stage.register_parameter("b" + std::to_string(i), piped.biases[i]);
  }
  parallel::DataParallel data_parallel(stage, mesh->group("data"));
  data_parallel.begin_backward(/*sync=*/false);  // the schedule's backwards interleave: reduce once, after
  PipelineEngine engine(spec, mesh->group("pipeline"));
  const int first = replica * spec.micro_batches;
  const double loss = engine.run(
      [&](int, const torch::Tensor& input, int micro) {
        torch::Tensor y = piped.blocks(input, 4 * s, 4 * s + 4);
        return s == 1 ? (y - both.targets[first + micro]).pow(2).mean() : y;
      },
      [&](int micro) { return both.inputs[first + micro]; });
  data_parallel.reduce_now();
  EXPECT_GT(loss, 0.0);
  for (int i = 4 * s; i < 4 * s + 4; ++i) {
    EXPECT_TRUE(torch::allclose(piped.weights[i].grad(), serial.weights[i].grad(), 1e-12, 1e-12)) << "block " << i;
    EXPECT_TRUE(torch::allclose(piped.biases[i].grad(), serial.biases[i].grad(), 1e-12, 1e-12)) << "block " << i;
  }
}

// Stage 1's process dies in the middle of a 1F1B step (after one backward); stage 0, waiting for a
// gradient that never comes, must fail with an error naming the pipeline group instead of hanging.
TEST(PipelineEngineTest, AStageThatDiesStopsTheOtherWithAnError) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  auto world = testing::worker_world();
  auto mesh = std::make_shared<dist::ProcessMesh>(world, std::vector<dist::MeshAxis>{{"pipeline", 2}});
  const auto group = mesh->group("pipeline");
  const Batch batch = make_batch(4);
  ToyModel model;
  PipelineEngine engine({ScheduleKind::k1F1B, 2, 4, 1}, group);
  const auto start = std::chrono::steady_clock::now();
  const std::string message = testing::expected_error([&] {
    engine.run(
        [&](int, const torch::Tensor& input, int micro) {
          if (group->rank() == 1 && micro == 1) std::_Exit(0);  // gone without a word (exit 0: the harness is content)
          torch::Tensor y = model.blocks(input, group->rank() * 4, group->rank() * 4 + 4);
          return group->rank() == 1 ? (y - batch.targets[micro]).pow(2).mean() : y;
        },
        [&](int micro) { return batch.inputs[micro]; });
  });
  EXPECT_TRUE(testing::Contains(message, group->name())) << message;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 20.0) << "the surviving stage waited for the 30 s timeout instead of seeing the peer go";
}

}  // namespace
}  // namespace kuafu::parallel::pipeline

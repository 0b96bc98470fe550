// Sharded optimizer steps over real Gloo ranks equal the unsharded step: LAMB / LARS per-layer norms
// summed over each parameter's shard group, and the global gradient norm with replicated parameters
// counted once, also on pipeline x tensor and data x tensor meshes. float64, so agreement is to
// summation-order rounding (1e-12). And the gradient shards that ZeRO and Gemini hand the optimizer in
// bf16 training: accumulated and averaged in float32.
#include <gtest/gtest.h>

#include "core/optim/algorithms.h"
#include "core/dist/process_mesh.h"
#include "core/memory/gemini.h"
#include "core/memory/zero.h"
#include "core/hooks/block_hooks.h"
#include "core/optim/grad_norm.h"
#include "tests/support/gradient_sums.h"
#include "tests/support/multiprocess.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

using optim::Param;
using optim::ParamGroup;

// Full-size weights and per-step gradients, the same on every rank (seeded).
struct FullModel {
  std::vector<std::string> names = {"split.weight", "uneven.weight", "tiny.weight", "replicated.weight",
                                    "norm.bias"};
  std::vector<torch::Tensor> weights;
  FullModel() {
    torch::manual_seed(11);
    for (const auto& shape : std::vector<std::vector<int64_t>>{{10, 6}, {7}, {3}, {3, 3}, {5}}) {
      weights.push_back(torch::randn(shape, torch::kFloat64));
    }
  }
  static std::vector<torch::Tensor> grads(int64_t step, const std::vector<torch::Tensor>& like) {
    torch::manual_seed(100 + step);
    std::vector<torch::Tensor> out;
    for (const auto& w : like) out.push_back(torch::randn_like(w) * (step == 1 ? 30.0 : 1.0));  // step 1 clips
    return out;
  }
  static bool sharded(size_t i) { return i < 3; }  // the rest are replicated on every rank
};

// Groups as the config would make them: the first four decay with trust scaling, the bias neither.
std::vector<ParamGroup> groups_of(const std::vector<Param>& params) {
  ParamGroup decay{"decay", {params.begin(), params.begin() + 4}, {}};
  decay.options.weight_decay = 0.01;
  ParamGroup no_decay{"no_decay", {params.begin() + 4, params.end()}, {}};
  no_decay.options.trust_scaling = false;
  return {decay, no_decay};
}

std::unique_ptr<optim::Optimizer> make(const std::string& name, const std::vector<Param>& params,
                                       dist::GroupPtr norm_group) {
  if (name == "lamb") {
    optim::LambOptions o;
    o.max_grad_norm = 5.0;
    o.trust_clamp = 10.0;
    o.norm_group = std::move(norm_group);
    return std::make_unique<optim::Lamb>(groups_of(params), o);
  }
  optim::LarsOptions o;
  o.trust_coefficient = 0.02;
  return std::make_unique<optim::Lars>(groups_of(params), o);
}

void sharded_step_equals_serial(const std::string& name) {
  auto world = testing::worker_world();
  const int ranks = world->size(), rank = world->rank();
  FullModel full;

  // Serial reference: the whole model on one process.
  std::vector<Param> serial;
  for (size_t i = 0; i < full.names.size(); ++i) {
    serial.push_back({full.names[i], full.weights[i].clone().requires_grad_(true), nullptr, true});
  }
  auto serial_optimizer = make(name, serial, nullptr);

  // This rank's pieces: dim 0 split over the world (the "tiny" one leaves a rank empty at 4 ranks).
  std::vector<Param> shards;
  for (size_t i = 0; i < full.names.size(); ++i) {
    if (FullModel::sharded(i)) {
      torch::Tensor piece = full.weights[i].tensor_split(ranks, 0)[rank].clone().requires_grad_(true);
      shards.push_back({full.names[i], piece, world->world_group(), true});
    } else {
      shards.push_back({full.names[i], full.weights[i].clone().requires_grad_(true), nullptr, rank == 0});
    }
  }
  auto sharded_optimizer = make(name, shards, world->world_group());

  for (int64_t step = 0; step < 3; ++step) {
    std::vector<torch::Tensor> serial_weights;
    for (const auto& p : serial) serial_weights.push_back(p.tensor);
    const auto grads = FullModel::grads(step, serial_weights);
    for (size_t i = 0; i < serial.size(); ++i) {
      serial[i].tensor.mutable_grad() = grads[i].clone();
      shards[i].tensor.mutable_grad() =
          FullModel::sharded(i) ? grads[i].tensor_split(ranks, 0)[rank].clone() : grads[i].clone();
    }
    const double serial_norm = optim::global_grad_norm(serial, nullptr);
    const double sharded_norm = optim::global_grad_norm(shards, world->world_group());
    EXPECT_NEAR(sharded_norm, serial_norm, 1e-12 * serial_norm) << "global norm at step " << step;
    serial_optimizer->set_lr(0.05);
    sharded_optimizer->set_lr(0.05);
    serial_optimizer->step();
    sharded_optimizer->step();
  }
  for (size_t i = 0; i < serial.size(); ++i) {
    const torch::Tensor expected =
        FullModel::sharded(i) ? serial[i].tensor.tensor_split(ranks, 0)[rank] : serial[i].tensor;
    EXPECT_TRUE(torch::allclose(shards[i].tensor, expected, 1e-12, 1e-12))
        << name << " " << full.names[i] << " on rank " << rank << " of " << ranks << ": max difference "
        << (shards[i].tensor - expected).abs().max().item<double>();
    // The step must have moved the weights, or the comparison proves nothing.
    if (expected.numel() == 0) continue;
    EXPECT_FALSE(torch::allclose(expected, FullModel::sharded(i)
                                               ? full.weights[i].tensor_split(ranks, 0)[rank]
                                               : full.weights[i]))
        << full.names[i];
  }
}

TEST(ShardedOptimizerTest, LambOnTwoRanksEqualsUnsharded) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  sharded_step_equals_serial("lamb");
}

TEST(ShardedOptimizerTest, LambOnFourRanksEqualsUnsharded) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  sharded_step_equals_serial("lamb");
}

TEST(ShardedOptimizerTest, LarsOnFourRanksEqualsUnsharded) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  sharded_step_equals_serial("lars");
}

// The global gradient norm on a 4-rank mesh against the serial norm of the whole model, for the two
// layouts that hybrid runs produce. Six parameters: 0-2 split over the tensor axis (Megatron-style),
// 3-5 replicated on every tensor rank (norm gains), so only tensor rank 0 counts them.
//  - pipeline x tensor: stage s holds parameters s, s+2 (and s+4); the norm is summed over the world.
//  - data x tensor: every data rank holds the same (already averaged) gradients, so the sum runs over
//    the tensor group only; summing over data too would count everything twice.
void global_norm_on_mesh(const std::string& outer) {
  auto world = testing::worker_world();
  dist::ProcessMesh mesh(world, {{outer, 2}, {"tensor", 2}});
  const int stage = mesh.coordinate(outer), tp = mesh.coordinate("tensor");
  torch::manual_seed(21);
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(torch::randn({4 + i, 3}, torch::kFloat64));
  double serial = 0;
  for (const auto& g : grads) serial += g.square().sum().item<double>();
  serial = std::sqrt(serial);

  std::vector<Param> local;
  for (int i = 0; i < 6; ++i) {
    if (outer == "pipeline" && i % 2 != stage) continue;  // another stage owns it
    const bool split = i < 3;
    torch::Tensor piece = split ? grads[i].tensor_split(2, 0)[tp].clone() : grads[i].clone();
    torch::Tensor weight = torch::zeros_like(piece).requires_grad_(true);
    weight.mutable_grad() = piece;
    local.push_back({"p" + std::to_string(i), weight, split ? mesh.group("tensor") : nullptr, split || tp == 0});
  }
  const dist::GroupPtr across = outer == "pipeline" ? world->world_group() : mesh.group("tensor");
  const double norm = optim::global_grad_norm(local, across);
  EXPECT_NEAR(norm, serial, 1e-12 * serial) << outer << " x tensor, rank " << world->rank();
}

TEST(ShardedGradNormTest, PipelineByTensorMeshCountsEachGradientOnce) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  global_norm_on_mesh("pipeline");
}

TEST(ShardedGradNormTest, DataByTensorMeshCountsEachGradientOnce) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  global_norm_on_mesh("data");
}

// Two linear blocks run through the block-call interface (Gemini gathers their chunks around them).
struct TwoBlocks : torch::nn::Module {
  TwoBlocks() {
    torch::manual_seed(3);
    first = register_module("first", torch::nn::Linear(6, 16));
    second = register_module("second", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(hooks::BlockHooks* hooks, const torch::Tensor& x) {
    const torch::Tensor hidden = hooks::run_block(hooks, {"first", {first.get()}}, x,
                                               [&](const torch::Tensor& in) { return torch::tanh(first(in)); });
    return hooks::run_block(hooks, {"second", {second.get()}}, hidden,
                         [&](const torch::Tensor& in) { return second(in); });
  }
  torch::nn::Linear first{nullptr}, second{nullptr};
};

// `strategy` (zero1, zero2, gemini) shards a bf16 model over 2 ranks in chunks of 64 elements (several
// per model); 8 micro-steps of 4 rows each, the outputs weighted at random so that the gradients differ
// in sign and size between micro-steps. Every piece's gradient must be the average over the ranks of
// the sum of the per-micro-step bf16 gradients, to float32 rounding (grad_reduce kFloat32) or to bf16
// rounding (kCompute: a wrong division would still show, by a factor of 2).
void sharded_bf16_gradients_average(const std::shared_ptr<dist::World>& world, const std::string& strategy,
                                    optim::GradReduce grad_reduce) {
  const int p = world->size(), r = world->rank();
  constexpr int64_t kMicroSteps = 8, kRows = 4, kChunkNumel = 64;
  torch::manual_seed(12);
  const torch::Tensor x = torch::randn({kMicroSteps * p * kRows, 6}).to(torch::kBFloat16);
  const torch::Tensor weighting = torch::randn({kMicroSteps * p * kRows, 3}).to(torch::kBFloat16);
  auto loss_of_rows = [&](TwoBlocks& model, hooks::BlockHooks* hooks, int64_t micro, int64_t rank) {
    const int64_t first = (micro * p + rank) * kRows;
    return (model.forward(hooks, x.narrow(0, first, kRows)) * weighting.narrow(0, first, kRows)).sum();
  };
  TwoBlocks reference;
  reference.to(torch::kBFloat16);  // rounded as the strategies round the weights for compute
  const testing::GradientSums expected = testing::gradient_sums(reference, kMicroSteps * p, p, [&](int64_t k) {
    return loss_of_rows(reference, nullptr, k / p, k % p);
  });

  TwoBlocks model;
  std::unique_ptr<memory::ChunkedMasters> sharded;
  hooks::BlockHooks* hooks = nullptr;
  if (strategy == "gemini") {
    auto gemini = std::make_unique<memory::Gemini>(
        model, world->world_group(), memory::GeminiOptions{kChunkNumel, torch::kBFloat16, {}, grad_reduce});
    hooks = gemini.get();
    sharded = std::move(gemini);
  } else {
    sharded = std::make_unique<memory::ZeroRedundancy>(
        model, world->world_group(),
        memory::ZeroOptions{strategy == "zero1" ? 1 : 2, kChunkNumel, torch::kBFloat16, grad_reduce});
  }
  ASSERT_GT(sharded->layout().num_chunks(), 2);
  for (int64_t micro = 0; micro < kMicroSteps; ++micro) {
    sharded->begin_backward(/*sync=*/micro + 1 == kMicroSteps);
    loss_of_rows(model, hooks, micro, r).backward();
  }
  sharded->finish_backward();
  // float32: at most 8 additions per rank plus the reduction's (one per micro-step for zero2 and Gemini,
  // which reduce each micro-step), each rounding by 2^-24 of the summed magnitudes: 16 x 6e-8 < 1e-6;
  // accumulating or reducing in bf16 errs near 2^-9 (2e-3). bf16: at most 8 roundings by 2^-9 (1/64).
  const bool float32 = grad_reduce == optim::GradReduce::kFloat32;
  const double tolerance = float32 ? 1e-6 : 8.0 / 512;
  for (const auto& piece : sharded->params()) {
    if (piece.tensor.numel() == 0) continue;
    const torch::Tensor grad = piece.tensor.grad();
    const double error = testing::error_in_magnitudes(grad, sharded->piece_of(piece.name, expected.sum.at(piece.name)),
                                                      sharded->piece_of(piece.name, expected.magnitude.at(piece.name)));
    EXPECT_LT(error, tolerance) << strategy << (float32 ? "" : " (compute)") << " " << piece.name << " on rank " << r;
    EXPECT_EQ(grad.scalar_type(), torch::kFloat32);
  }
}

TEST(ShardedMainGradTest, Zero1Bf16GradientsAccumulateAndAverageInFloat32) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  sharded_bf16_gradients_average(testing::worker_world(), "zero1", optim::GradReduce::kFloat32);
}

TEST(ShardedMainGradTest, Zero2Bf16GradientsAccumulateAndAverageInFloat32) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  sharded_bf16_gradients_average(testing::worker_world(), "zero2", optim::GradReduce::kFloat32);
}

TEST(ShardedMainGradTest, GeminiBf16GradientsAccumulateAndAverageInFloat32) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  sharded_bf16_gradients_average(testing::worker_world(), "gemini", optim::GradReduce::kFloat32);
}

TEST(ShardedMainGradTest, ComputeDtypeReductionStillAverages) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  const auto world = testing::worker_world();
  for (const std::string strategy : {"zero1", "zero2", "gemini"}) {
    sharded_bf16_gradients_average(world, strategy, optim::GradReduce::kCompute);
  }
}

}  // namespace
}  // namespace kuafu

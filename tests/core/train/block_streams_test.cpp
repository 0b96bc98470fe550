// The shared path for models of several streams (hooks::BlockModel over hooks::Tensors, batches of named
// features, recycling): a toy of two streams written here, run by ParallelModel, equals the same maths
// computed by hand from its modules (no sites, no ParallelModel) — the loss and every parameter's gradient,
// in float64 where only the order of the same operations could differ (1e-12) — with every block
// checkpointed too; pipelines and sequence parallelism, which send or cut one stream, refuse it by name, and a
// missing feature is named.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "core/train/parallelize.h"
#include "core/util/error.h"

namespace kuafu::train {
namespace {

using hooks::Tensors;

// Streams u, v [B, 4]. Head: u = A a + P ρ_u, v = B b + Q ρ_v (ρ: what the previous iteration recycled, zeros
// before the first). Block i: u' = u + tanh(M_i v), v' = v + tanh(N_i u'). Tail: mean squared error of
// w·(u ⊙ v) against the target; it recycles (tanh u, tanh v). Iterations: the batch's "iterations" feature.
struct TwoStreamsImpl : torch::nn::Module, hooks::BlockModel {
  TwoStreamsImpl() {
    auto linear = [this](const std::string& name) { return register_module(name, torch::nn::Linear(4, 4)); };
    a = linear("a");
    b = linear("b");
    p = linear("p");
    q = linear("q");
    auto blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
    for (int i = 0; i < 3; ++i) {
      auto block = blocks->register_module(std::to_string(i), std::make_shared<torch::nn::Module>());
      m.push_back(block->register_module("m", torch::nn::Linear(4, 4)));
      n.push_back(block->register_module("n", torch::nn::Linear(4, 4)));
    }
    w = register_module("w", torch::nn::Linear(4, 1));
    to(torch::kFloat64);
  }
  torch::nn::Module& module() override { return *this; }
  int64_t num_blocks() const override { return 3; }
  hooks::ModelPart head_part() const override { return {"head", {"a", "b", "p", "q"}}; }
  hooks::ModelPart block_part(int64_t i) const override { return {"block." + std::to_string(i), {"blocks." + std::to_string(i)}}; }
  hooks::ModelPart tail_part() const override { return {"tail", {"w"}}; }

  Tensors head_streams(const Batch& batch, const Tensors& recycled) override {
    const torch::Tensor& x = batch["a"];
    const torch::Tensor zeros = torch::zeros_like(x);
    return {a(x) + p(recycled.empty() ? zeros : recycled[0]), b(batch["b"]) + q(recycled.empty() ? zeros : recycled[1])};
  }
  Tensors block_streams(int64_t i, const Tensors& s, const Batch& /*batch*/) override {
    const torch::Tensor u = s[0] + torch::tanh(m[static_cast<size_t>(i)](s[1]));
    return {u, s[1] + torch::tanh(n[static_cast<size_t>(i)](u))};
  }
  torch::Tensor tail_loss_streams(const Tensors& s, const Batch& batch) override {
    return torch::mse_loss(w(s[0] * s[1]), batch["target"]);
  }
  torch::Tensor tail_sums_streams(const Tensors& s, const Batch& batch) override {
    const double items = static_cast<double>(batch["target"].numel());
    return torch::tensor({tail_loss_streams(s, batch).item<double>() * items, items, 0.0}, torch::kFloat64);
  }
  int64_t iterations(const Batch& batch) const override { return batch["iterations"].item<int64_t>(); }
  Tensors recycled_streams(const Tensors& s, const Batch& /*batch*/) override { return {torch::tanh(s[0]), torch::tanh(s[1])}; }

  torch::nn::Linear a{nullptr}, b{nullptr}, p{nullptr}, q{nullptr}, w{nullptr};
  std::vector<torch::nn::Linear> m, n;
};
TORCH_MODULE(TwoStreams);

Batch two_stream_batch(int64_t iterations) {
  auto generator = at::detail::createCPUGenerator(7);
  Batch batch;
  batch.features["a"] = torch::randn({5, 4}, generator, torch::kFloat64);
  batch.features["b"] = torch::randn({5, 4}, generator, torch::kFloat64);
  batch.features["target"] = torch::randn({5, 1}, generator, torch::kFloat64);
  batch.features["iterations"] = torch::scalar_tensor(iterations, torch::kInt64);
  return batch;
}

// The toy's loss computed from its modules directly: iterations - 1 runs without gradient, then the last.
torch::Tensor loss_by_hand(TwoStreamsImpl& toy, const Batch& batch) {
  const torch::Tensor x = batch["a"], y = batch["b"];
  torch::Tensor ru = torch::zeros_like(x), rv = torch::zeros_like(y);
  auto run = [&] {
    torch::Tensor u = toy.a(x) + toy.p(ru), v = toy.b(y) + toy.q(rv);
    for (size_t i = 0; i < 3; ++i) {
      u = u + torch::tanh(toy.m[i](v));
      v = v + torch::tanh(toy.n[i](u));
    }
    return std::make_pair(u, v);
  };
  for (int64_t i = 0; i + 1 < batch["iterations"].item<int64_t>(); ++i) {
    torch::NoGradGuard no_grad;
    const auto [u, v] = run();
    ru = torch::tanh(u);
    rv = torch::tanh(v);
  }
  const auto [u, v] = run();
  return torch::mse_loss(toy.w(u * v), batch["target"]);
}

std::map<std::string, torch::Tensor> gradients_of(TwoStreamsImpl& toy, const torch::Tensor& loss) {
  toy.zero_grad();
  loss.backward();
  std::map<std::string, torch::Tensor> grads;
  for (const auto& item : toy.named_parameters()) grads[item.key()] = item.value().grad().clone();
  return grads;
}

class BlockStreamsTest : public ::testing::TestWithParam<bool> {};

TEST_P(BlockStreamsTest, ParallelModelRecyclesAndEqualsTheMathsByHand) {
  const bool checkpointed = GetParam();
  torch::manual_seed(0);
  TwoStreams toy;
  ParallelOptions options;
  options.checkpoint_activations = checkpointed;
  ParallelModel runner(*toy, options);
  for (const int64_t iterations : {1, 3}) {
    SCOPED_TRACE("iterations " + std::to_string(iterations));
    const Batch batch = two_stream_batch(iterations);
    const torch::Tensor expected_loss = loss_by_hand(*toy, batch);
    const auto expected = gradients_of(*toy, expected_loss);
    const torch::Tensor loss = runner.loss(batch);
    const auto actual = gradients_of(*toy, loss);
    EXPECT_NEAR(loss.item<double>(), expected_loss.item<double>(), 1e-12);
    ASSERT_EQ(actual.size(), expected.size());
    for (const auto& [name, grad] : expected) {
      EXPECT_LE((actual.at(name) - grad).abs().max().item<double>(), 1e-12) << name;
      // (Without recycling the recycled streams are zeros: p's and q's weights get no gradient.)
      if (iterations > 1) {
        EXPECT_GT(grad.abs().max().item<double>(), 0.0) << name << ": a gradient that is zero proves nothing";
      }
    }
    // The evaluation sums are the loss's.
    const torch::Tensor sums = runner.evaluate(batch);
    EXPECT_NEAR(sums[0].item<double>() / sums[1].item<double>(), expected_loss.item<double>(), 1e-12);
  }
  // Recycling changes the loss (the recycled streams reach the head).
  EXPECT_GT(std::abs(loss_by_hand(*toy, two_stream_batch(3)).item<double>() - loss_by_hand(*toy, two_stream_batch(1)).item<double>()), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, BlockStreamsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Checkpointed" : "Plain"; });

TEST(BlockStreamsRefusalTest, SequenceParallelismAndPipelinesNeedOneStream) {
  TwoStreams toy;
  ParallelOptions sequence, pipeline;
  sequence.sequence.mode = parallel::sequence::SequenceMode::kAllToAll;
  sequence.sequence.size = 2;
  pipeline.schedule.stages = 2;
  for (const auto& [options, says] : {std::make_pair(sequence, "sequence parallelism cuts a model's one stream"),
                                      std::make_pair(pipeline, "pipeline stages send a model's one stream")}) {
    try {
      ParallelModel runner(*toy, options);
      ADD_FAILURE() << says << ": accepted for two streams";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("carries several"), std::string::npos) << e.what();
    }
  }
}

TEST(BlockStreamsRefusalTest, AMissingFeatureIsNamed) {
  const Batch batch = two_stream_batch(1);
  try {
    (void)batch["msa_feat"];
    FAIL() << "a missing feature was returned";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "the batch has no feature 'msa_feat' (it has: a, b, iterations, target)");
  }
}

}  // namespace
}  // namespace kuafu::train

// The ViT model: Hugging Face names and shapes, forward shapes, the parameter count, label smoothing
// worked by hand, a few AdamW steps on one batch lowering the loss, and tensor parallelism (1D on 2
// ranks, 2D on 2 x 2) against the serial model from the same seed in float64 (tolerance 1e-10: only the
// summation order differs): initial weights, logits, loss and every parameter's gradient.
#include <gtest/gtest.h>

#include "apps/vit/model.h"
#include "core/train/lazy_model.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::vit {
namespace {

ViTConfig tiny() {
  ViTConfig c;
  c.image_size = 28;
  c.patch_size = 7;
  c.num_channels = 1;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.num_labels = 10;
  return c;
}

TEST(ViTModelTest, HuggingFaceNamesShapesAndParameterCount) {
  ViTForImageClassification model(tiny());
  const auto params = model->named_parameters();
  auto shape = [&](const std::string& name) { return params[name].sizes().vec(); };
  EXPECT_EQ(shape("vit.embeddings.cls_token"), (std::vector<int64_t>{1, 1, 32}));
  EXPECT_EQ(shape("vit.embeddings.position_embeddings"), (std::vector<int64_t>{1, 17, 32}));
  EXPECT_EQ(shape("vit.embeddings.patch_embeddings.projection.weight"), (std::vector<int64_t>{32, 1, 7, 7}));
  EXPECT_EQ(shape("vit.encoder.layer.1.attention.attention.query.weight"), (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(shape("vit.encoder.layer.0.attention.output.dense.bias"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shape("vit.encoder.layer.0.intermediate.dense.weight"), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(shape("vit.encoder.layer.0.output.dense.weight"), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shape("vit.encoder.layer.0.layernorm_before.weight"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shape("vit.layernorm.bias"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shape("classifier.weight"), (std::vector<int64_t>{10, 32}));
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  EXPECT_EQ(model->config.parameter_count(), total);
  // Truncated-normal weights stay within two standard deviations; biases start at zero.
  EXPECT_LE(params["vit.encoder.layer.0.intermediate.dense.weight"].abs().max().item<double>(), 0.04);
  EXPECT_EQ(params["classifier.bias"].abs().max().item<double>(), 0.0);
}

// Every parameter is made on the device the model is given (meta: no storage, nothing copied).
TEST(ViTModelTest, EveryParameterIsMadeOnTheGivenDevice) {
  const auto on_meta = parallel::ModelOptions::serial_on(torch::kMeta);
  ViTForImageClassification model(tiny(), on_meta);
  for (const auto& p : model->named_parameters()) EXPECT_TRUE(p.value().is_meta()) << p.key();
  // Embeddings 4 (class token, positions, projection weight and bias), 16 per layer, final norm and head 4.
  EXPECT_EQ(model->named_parameters().size(), 4u + 16u * 2u + 4u);
}

// Lazy construction: described on the meta device, given storage, then initialised from the same seed,
// the ViT equals the one built eagerly, bit for bit (LayerNorms included, which a lazily made parameter
// would otherwise leave at zero).
TEST(ViTModelTest, DescribedThenInitialisedEqualsTheEagerModel) {
  torch::manual_seed(5);
  ViTForImageClassification eager(tiny());
  ViTForImageClassification lazy(tiny(), parallel::ModelOptions::serial_on(torch::kMeta));
  train::materialize(*lazy, {torch::kCPU});
  torch::manual_seed(5);
  lazy->initialize();
  const auto expected = eager->named_parameters();
  for (const auto& item : lazy->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), expected[item.key()])) << item.key();
  }
  EXPECT_EQ(lazy->named_parameters()["vit.layernorm.weight"].min().item<double>(), 1.0);
}

TEST(ViTModelTest, ForwardShapesAndBadInput) {
  ViTForImageClassification model(tiny());
  EXPECT_EQ(model->forward(torch::randn({3, 1, 28, 28})).sizes().vec(), (std::vector<int64_t>{3, 10}));
  const std::string message = testing::error_message([&] { model->forward(torch::randn({3, 3, 28, 28})); });
  EXPECT_TRUE(testing::Contains(message, "[B, 1, 28, 28]")) << message;
  ViTConfig bad = tiny();
  bad.patch_size = 5;
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { ViTForImageClassification m(bad); }), "model.patch_size"));
}

TEST(ViTModelTest, LabelSmoothingByHand) {
  // 3 classes, ε = 0.3: 0.1 everywhere, plus 0.7 on the label.
  const torch::Tensor t = smoothed_targets(torch::tensor({2, 0}), 3, 0.3);
  EXPECT_TRUE(torch::allclose(t, torch::tensor({{0.1, 0.1, 0.8}, {0.8, 0.1, 0.1}}).to(t.scalar_type()), 1e-6, 1e-7));
  EXPECT_TRUE(testing::Contains(testing::error_message([] { smoothed_targets(torch::tensor({3}), 3, 0.1); }), "[0, 3)"));
}

TEST(ViTModelTest, AFewStepsLowerTheLoss) {
  torch::manual_seed(1);
  ViTForImageClassification model(tiny());
  const torch::Tensor pixels = torch::randn({16, 1, 28, 28});
  const torch::Tensor targets = smoothed_targets(torch::randint(10, {16}), 10, 0.0);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
  const double first = model->loss(pixels, targets).item<double>();
  for (int step = 0; step < 30; ++step) {
    optimizer.zero_grad();
    model->loss(pixels, targets).backward();
    optimizer.step();
  }
  EXPECT_LT(model->loss(pixels, targets).item<double>(), 0.5 * first);  // 16 images are memorised
}

void tensor_parallel_vit_equals_serial(parallel::TensorMode mode) {
  auto world = testing::worker_world();
  parallel::TensorParallel tp;
  tp.spec = {mode, world->size(), 1};
  tp.mesh = std::make_shared<dist::ProcessMesh>(world, parallel::tensor_mesh_axes(tp.spec));
  torch::manual_seed(5);
  ViTForImageClassification serial(tiny());
  torch::manual_seed(5);
  ViTForImageClassification parallel_model(tiny(), tp);
  serial->to(torch::kFloat64);
  parallel_model->to(torch::kFloat64);

  torch::manual_seed(6);
  const torch::Tensor pixels = torch::randn({4, 1, 28, 28}, torch::kFloat64);
  const torch::Tensor targets = smoothed_targets(torch::randint(10, {4}), 10, 0.1);
  torch::Tensor serial_loss = serial->loss(pixels, targets);
  serial_loss.backward();
  torch::Tensor parallel_loss = parallel_model->loss(pixels, targets);
  parallel_loss.backward();
  EXPECT_NEAR(parallel_loss.item<double>(), serial_loss.item<double>(), 1e-10);

  const auto layouts = parallel::collect_layouts(*parallel_model);
  const auto expected = serial->named_parameters();
  for (const auto& item : parallel_model->named_parameters()) {
    const auto found = layouts.find(item.key());
    const parallel::Layout cut = found == layouts.end() ? parallel::Layout{} : found->second;
    const torch::Tensor weight = parallel::gather_full(item.value().detach(), cut, *tp.mesh);
    const torch::Tensor grad = parallel::gather_full(item.value().grad(), cut, *tp.mesh);
    EXPECT_TRUE(torch::equal(weight, expected[item.key()].detach())) << item.key() << " starts unlike the serial one";
    EXPECT_TRUE(torch::allclose(grad, expected[item.key()].grad(), 1e-10, 1e-10))
        << item.key() << " gradient differs by " << (grad - expected[item.key()].grad()).abs().max().item<double>();
  }
}

TEST(ViTTensorParallelTest, OneDimensionalOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  tensor_parallel_vit_equals_serial(parallel::TensorMode::k1D);
}

TEST(ViTTensorParallelTest, TwoDimensionalOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  tensor_parallel_vit_equals_serial(parallel::TensorMode::k2D);
}

}  // namespace
}  // namespace kuafu::vit

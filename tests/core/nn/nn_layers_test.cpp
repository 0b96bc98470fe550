// The image and diffusion layers of core/nn (conv.h, cross_attention.h) against PyTorch and diffusers
// in float64: each layer gets the reference's weights by diffusers' names, and its output and the
// gradients of its inputs and of every parameter, for a fixed random upstream gradient, must equal
// the reference's (tests/python/diffusers_layers_reference.py). The 1D tensor-parallel CrossAttention on
// two Gloo ranks must equal the serial layer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <tuple>

#include "core/nn/conv.h"
#include "core/nn/cross_attention.h"
#include "core/nn/torch_init.h"
#include "core/nn/transformer_block.h"
#include "core/ops/attention.h"
#include "core/train/lazy_model.h"
#include "tests/support/multiprocess.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/same_parameters.h"
#include "tests/support/tensor_parallel_checks.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

// float64 on both sides with the same maths: only the order of summation differs (BLAS blocking,
// im2col vs direct convolution, the fused attention kernel vs diffusers' masked one), each sum of a few
// dozen O(1) terms off by a few 1e-16; 1e-10 relative and absolute is far above that and far below
// any real mistake (a wrong weight, head split or mask moves results by O(0.1)).
constexpr double kTolerance = 1e-10;

const testing::Reference& reference() {
  static const testing::Reference built = testing::build_reference("diffusers_layers_reference.py", "diffusers_layers");
  return built;
}

// The reference's tensors named `prefix`NAME, by NAME.
std::map<std::string, torch::Tensor> tensors_under(const std::string& prefix) {
  std::map<std::string, torch::Tensor> found;
  for (const auto& [name, tensor] : reference().outputs.file.tensors) {
    if (name.rfind(prefix, 0) == 0) found[name.substr(prefix.size())] = tensor;
  }
  return found;
}

// Copies `tensors` into the module's parameters of the same names: a name the module lacks, a
// parameter with no tensor or a shape that differs is an error, so a misnamed layer cannot pass.
void load_parameters(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  auto params = module.named_parameters();
  for (const auto& [name, value] : tensors) {
    torch::Tensor* param = params.find(name);
    KUAFU_CHECK(param, "the module has no parameter ", name);
    KUAFU_CHECK(param->sizes() == value.sizes(), name, " is ", param->sizes(), " here but ", value.sizes(),
                " in diffusers");
    param->copy_(value);
  }
  for (const auto& item : params) KUAFU_CHECK(tensors.count(item.key()), "diffusers has no tensor for ", item.key());
}

double max_difference(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Largest differences over every case, printed at the end of each test.
struct Differences {
  double output = 0, gradient = 0;
  void print(const std::string& what) const {
    std::printf("%s: max |difference| output %.3g, gradients %.3g\n", what.c_str(), output, gradient);
  }
};

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& what,
                  double& largest) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double difference = max_difference(actual, expected);
  largest = std::max(largest, difference);
  EXPECT_TRUE(torch::allclose(actual, expected, kTolerance, kTolerance)) << what << ": max difference " << difference;
}

// The inputs of a case; those the case lacks are undefined.
struct Inputs {
  torch::Tensor x, context, key_mask;
};

// Loads case `name`'s parameters into `module`, runs `call` on its inputs, back-propagates its upstream
// gradient and compares the output and the gradients of x, the context and every parameter.
void expect_matches_reference(const std::string& name, torch::nn::Module& module,
                              const std::function<torch::Tensor(const Inputs&)>& call, Differences& differences) {
  SCOPED_TRACE(name);
  const auto params = tensors_under(name + ".param.");
  load_parameters(module, params);
  const auto case_tensors = tensors_under(name + ".");
  auto input = [&](const std::string& key, bool grad) {
    const auto found = case_tensors.find(key);
    return found == case_tensors.end() ? torch::Tensor() : found->second.clone().requires_grad_(grad);
  };
  const Inputs inputs{input("x", true), input("context", true), input("key_mask", false)};
  const torch::Tensor y = call(inputs);
  (y * reference()[name + ".upstream"]).sum().backward();

  expect_close(y.detach(), reference()[name + ".y"], name + " output", differences.output);
  expect_close(inputs.x.grad(), reference()[name + ".grad.x"], name + " gradient of x", differences.gradient);
  if (inputs.context.defined()) {
    expect_close(inputs.context.grad(), reference()[name + ".grad.context"], name + " gradient of the context",
                 differences.gradient);
  }
  for (const auto& item : module.named_parameters()) {
    expect_close(item.value().grad(), reference()[name + ".grad." + item.key()], name + " gradient of " + item.key(),
                 differences.gradient);
  }
}

TEST(NnLayersTest, Conv2dMatchesPyTorch) {
  Differences differences;
  const struct {
    const char* name;
    nn::Conv2dSpec spec;
  } cases[] = {
      {"conv_s1", {3, 5, /*kernel=*/3, /*stride=*/1, /*padding=*/1, /*bias=*/true, torch::kCPU, torch::kFloat64}},
      {"conv_s2", {3, 5, 3, 2, 1, true, torch::kCPU, torch::kFloat64}},
      {"conv_1x1", {4, 6, 1, 1, 0, false, torch::kCPU, torch::kFloat64}},
  };
  for (const auto& c : cases) {
    nn::Conv2d conv(c.spec);
    EXPECT_EQ(conv->weight.scalar_type(), torch::kFloat64);
    expect_matches_reference(c.name, *conv, [&](const Inputs& in) { return conv(in.x); }, differences);
  }
  differences.print("Conv2d");
}

// Kuafu's layers start at zero (or on the meta device) and are drawn by nn::initialize_like_torch: from
// one seed, a convolution with and without bias, a linear layer, a GroupNorm and a LayerNorm hold exactly
// what LibTorch's torch::nn layers draw in their constructors (the reference), also when described on
// the meta device first and given storage after.
TEST(NnLayersTest, InitialisationIsPyTorchsDrawsEvenWhenDescribedFirst) {
  struct Layers : torch::nn::Module {
    explicit Layers(const torch::Device& device) {
      register_module("conv", nn::Conv2d(nn::Conv2dSpec{3, 5, 3, 1, 1, /*bias=*/true, device}));
      register_module("conv_plain", nn::Conv2d(nn::Conv2dSpec{4, 2, 1, 1, 0, /*bias=*/false, device}));
      register_module("linear", parallel::SerialLinear(parallel::LinearSpec{4, 6}, device));
      register_module("group_norm", nn::GroupNorm(nn::GroupNormSpec{2, 6, 1e-5, true, device}));
      register_module("layer_norm", parallel::SerialLayerNorm(6, 1e-5, device));
    }
  };
  torch::manual_seed(9);
  torch::nn::Sequential reference;
  reference->push_back("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 5, 3).padding(1)));
  reference->push_back("conv_plain", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 2, 1).bias(false)));
  reference->push_back("linear", torch::nn::Linear(4, 6));
  reference->push_back("group_norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(2, 6)));
  reference->push_back("layer_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
  for (const bool described : {false, true}) {
    Layers layers(described ? torch::kMeta : torch::kCPU);
    if (described) {
      for (const auto& p : layers.parameters()) ASSERT_TRUE(p.is_meta());
      train::materialize(layers, train::Materialization::all_in(torch::kCPU, torch::kFloat32));
    }
    torch::manual_seed(9);
    nn::initialize_like_torch(layers);
    testing::expect_same_parameters(layers, *reference, std::nullopt, described ? "(described first)" : "");
  }
}

TEST(NnLayersTest, Upsample2DMatchesDiffusers) {
  Differences differences;
  nn::Upsample2D upsample(nn::ResampleSpec{4, 6, 1, torch::kCPU, torch::kFloat64});
  expect_matches_reference("upsample", *upsample, [&](const Inputs& in) { return upsample(in.x); }, differences);
  // diffusers' output_size: [B, 4, 3, 5] to 7 x 10 (an odd skip connection's size).
  nn::Upsample2D sized(nn::ResampleSpec{4, 0, 1, torch::kCPU, torch::kFloat64});
  expect_matches_reference(
      "upsample_size", *sized, [&](const Inputs& in) { return sized(in.x, std::vector<int64_t>{7, 10}); }, differences);
  differences.print("Upsample2D");
}

TEST(NnLayersTest, Downsample2DMatchesDiffusers) {
  Differences differences;
  nn::Downsample2D unet(nn::ResampleSpec{4, 6, /*padding=*/1, torch::kCPU, torch::kFloat64});
  expect_matches_reference("downsample", *unet, [&](const Inputs& in) { return unet(in.x); }, differences);
  nn::Downsample2D vae(nn::ResampleSpec{4, 0, /*padding=*/0, torch::kCPU, torch::kFloat64});
  expect_matches_reference("downsample_pad0", *vae, [&](const Inputs& in) { return vae(in.x); }, differences);
  differences.print("Downsample2D");
}

TEST(NnLayersTest, GroupNormMatchesPyTorch) {
  Differences differences;
  nn::GroupNorm norm(nn::GroupNormSpec{4, 8, 1e-6, /*affine=*/true, torch::kCPU, torch::kFloat64});
  expect_matches_reference("group_norm", *norm, [&](const Inputs& in) { return norm(in.x); }, differences);
  nn::GroupNorm plain(nn::GroupNormSpec{2, 6, 1e-5, /*affine=*/false, torch::kCPU, torch::kFloat64});
  EXPECT_TRUE(plain->parameters().empty());
  expect_matches_reference("group_norm_plain", *plain, [&](const Inputs& in) { return plain(in.x); }, differences);
  differences.print("GroupNorm");
}

TEST(NnLayersTest, CrossAttentionMatchesDiffusers) {
  Differences differences;
  // Inner width 4 x 5 = 20, queries of width 12, a context of width 10 (diffusers' bias=False default).
  const nn::CrossAttentionSpec cross{12, 10, /*heads=*/4, /*dim_head=*/5};
  nn::CrossAttention attention(cross);
  attention->to(torch::kFloat64);
  expect_matches_reference("attention_cross", *attention, [&](const Inputs& in) { return attention(in.x, in.context); },
                           differences);

  nn::CrossAttention self(nn::CrossAttentionSpec{12, 0, 2, 6, /*bias=*/true});
  self->to(torch::kFloat64);
  expect_matches_reference("attention_self", *self, [&](const Inputs& in) { return self(in.x); }, differences);

  nn::CrossAttention masked(cross);
  masked->to(torch::kFloat64);
  expect_matches_reference("attention_mask", *masked,
                           [&](const Inputs& in) { return masked(in.x, in.context, in.key_mask); }, differences);
  differences.print("CrossAttention");
}

// Under bf16 and fp16 the attention's scores and softmax are float32 (diffusers' upcast_attention; the
// fused kernels accumulate so), on both of ops::scaled_dot_product_attention's paths (64 keys: products;
// 600: the fused kernel), padding mask or not. Reference: float64 on the same rounded inputs. Scores of
// spread 9 (bf16 spacing 0.06 there) put bf16 products and softmax 0.11 to 0.21 off (measured with
// PyTorch), float32 scores 0.012 to 0.014, the rest being the probabilities' and output's rounding to
// bf16 (values of size 4): 0.03 lies between. fp16 scores past 1e5 overflow to inf and NaN unless
// upcast; upcast, the output is within fp16's rounding of the float64 one (0.01).
TEST(NnLayersTest, AttentionScoresAndSoftmaxAreFloat32UnderReducedPrecision) {
  torch::manual_seed(11);
  for (const int64_t keys : {64, 600}) {
    const torch::Tensor q = torch::randn({1, 2, keys, 32}) * 3, k = torch::randn({1, 2, keys, 32}) * 3, v = torch::randn({1, 2, keys, 32});
    ops::AttentionMask padding;
    padding.key_padding = torch::ones({1, keys}, torch::kBool);
    padding.key_padding.narrow(1, keys - 5, 5).fill_(false);
    for (const bool masked : {false, true}) {
      const ops::AttentionMask mask = masked ? padding : ops::AttentionMask{};
      for (const auto& [dtype, scale, tolerance] : {std::tuple{torch::kBFloat16, 1.0, 0.03}, std::tuple{torch::kHalf, 1000.0, 0.01}}) {
        const torch::Tensor qr = (q * scale).to(dtype), kr = k.to(dtype), vr = v.to(dtype);
        const torch::Tensor expected =
            ops::scaled_dot_product_attention(qr.to(torch::kFloat64), kr.to(torch::kFloat64), vr.to(torch::kFloat64), false, 0.0, mask);
        const torch::Tensor out = ops::scaled_dot_product_attention(qr, kr, vr, false, 0.0, mask);
        EXPECT_EQ(out.scalar_type(), dtype);
        EXPECT_TRUE(torch::isfinite(out).all().item<bool>()) << keys << " keys, " << dtype << (masked ? ", masked" : "");
        EXPECT_LT((out.to(torch::kFloat64) - expected).abs().max().item<double>(), tolerance)
            << keys << " keys, " << dtype << (masked ? ", masked" : "");
      }
    }
  }
}

TEST(NnLayersTest, MistakesNameWhatToChange) {
  EXPECT_TRUE(testing::Contains(testing::expected_error([] { nn::GroupNorm(nn::GroupNormSpec{32, 48}); }), "48 channels"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([] { nn::Downsample2D(nn::ResampleSpec{4, 4, 2}); }),
                                "padding"));
  nn::Upsample2D upsample(nn::ResampleSpec{4});
  EXPECT_TRUE(
      testing::Contains(testing::expected_error([&] { upsample(torch::zeros({1, 3, 2, 2})); }), "[B, 4, H, W]"));
  nn::CrossAttention attention(nn::CrossAttentionSpec{8, 6, 2, 4});
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { attention(torch::zeros({1, 3, 8})); }),
                                "cross_attention_dim (6) == query_dim (8)"));
  EXPECT_TRUE(testing::Contains(
      testing::expected_error(
          [&] { attention(torch::zeros({1, 3, 8}), torch::zeros({1, 5, 6}), torch::ones({1, 4})); }),
      "[B, M] = [1, 5]"));
}

// 1D tensor parallelism: to_q, to_k, to_v cut by output features (whole heads per rank), to_out.0
// by input features, on two Gloo ranks against the serial layer with the same weights, in float64
// (the sums split over ranks: 1e-12 as the other tensor-parallel tests).
constexpr double kParallelTolerance = 1e-12;

parallel::TensorParallel one_dimensional_on_world() {
  auto world = testing::worker_world();
  parallel::TensorParallel tp;
  tp.spec = {parallel::TensorMode::k1D, world->size(), 1};
  tp.mesh = std::make_shared<dist::ProcessMesh>(world, parallel::tensor_mesh_axes(tp.spec));
  return tp;
}

void parallel_attention_equals_serial(const parallel::TensorParallel& tp, const nn::CrossAttentionSpec& spec,
                                      bool cross, bool masked) {
  SCOPED_TRACE(std::string(cross ? "cross" : "self") + (masked ? ", masked" : ""));
  const dist::ProcessMesh& mesh = *tp.mesh;
  nn::CrossAttention serial(spec), sharded(spec, tp);
  serial->to(torch::kFloat64);
  sharded->to(torch::kFloat64);
  torch::manual_seed(11);  // every rank draws the same weights and inputs
  const auto layouts = parallel::collect_layouts(*sharded);
  std::vector<testing::BoundParam> bound;
  auto local = sharded->named_parameters();
  for (const auto& item : serial->named_parameters()) {
    const torch::Tensor full = testing::randn64(item.value().sizes()) * 0.5;
    {
      torch::NoGradGuard no_grad;
      item.value().copy_(full);
    }
    const auto layout = layouts.count(item.key()) ? layouts.at(item.key()) : parallel::Layout{};
    torch::Tensor* block = local.find(item.key());
    ASSERT_TRUE(block) << "the tensor-parallel layer has no " << item.key();
    testing::load_block(*block, full, layout, mesh);
    bound.push_back({item.key(), item.value(), block, layout});  // the serial layer's parameter and its block
  }
  EXPECT_EQ(bound.size(), local.size());
  EXPECT_TRUE(layouts.count("to_q.weight") && layouts.count("to_out.0.weight")) << "the layers are not cut";

  const torch::Tensor x0 = testing::randn64({2, 5, spec.query_dim});                    // [B, N, Cq]
  const torch::Tensor c0 = cross ? testing::randn64({2, 4, spec.cross_attention_dim}) : torch::Tensor();  // [B, M, Cc]
  torch::Tensor key_mask;
  if (masked) key_mask = torch::tensor({true, true, false, true, false, true, true, true}).view({2, 4});  // [B, M]
  const torch::Tensor upstream = testing::randn64({2, 5, spec.query_dim});

  auto run = [&](nn::CrossAttention& layer, torch::Tensor& x, torch::Tensor& c) {
    x = x0.clone().requires_grad_();
    if (cross) c = c0.clone().requires_grad_();
    const torch::Tensor y = layer(x, c, key_mask);
    (y * upstream).sum().backward();
    return y.detach();
  };
  torch::Tensor xs, cs, xp, cp;
  const torch::Tensor ys = run(serial, xs, cs);
  const torch::Tensor yp = run(sharded, xp, cp);

  testing::expect_close(yp, ys, "output", kParallelTolerance);
  testing::expect_close(xp.grad(), xs.grad(), "gradient of x", kParallelTolerance);
  if (cross) testing::expect_close(cp.grad(), cs.grad(), "gradient of the context", kParallelTolerance);
  testing::expect_gradients(bound, mesh, kParallelTolerance);
  std::printf("rank %d, %s%s: max |difference| output %.3g, x gradient %.3g\n", testing::worker_rank(),
              cross ? "cross" : "self", masked ? " masked" : "", max_difference(yp, ys),
              max_difference(xp.grad(), xs.grad()));
}

TEST(NnLayersTest, TensorParallelCrossAttentionEqualsSerialOnTwoRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  const parallel::TensorParallel tp = one_dimensional_on_world();
  // 4 heads of 3 over queries of width 10 and a context of width 7, with q/k/v biases (cut per column).
  const nn::CrossAttentionSpec cross{10, 7, /*heads=*/4, /*dim_head=*/3, /*bias=*/true};
  parallel_attention_equals_serial(tp, cross, /*cross=*/true, /*masked=*/false);
  parallel_attention_equals_serial(tp, cross, /*cross=*/true, /*masked=*/true);
  parallel_attention_equals_serial(tp, nn::CrossAttentionSpec{10, 0, 2, 5}, /*cross=*/false, /*masked=*/false);
  // Heads a rank cannot hold whole are refused with the mode and size.
  EXPECT_TRUE(testing::Contains(
      testing::expected_error([&] { nn::CrossAttention refused(nn::CrossAttentionSpec{9, 0, 3, 3}, tp); }),
      "3 attention heads must divide by the 2 blocks"));
}

// The Llama family's block under 1D tensor parallelism on two Gloo ranks against the serial block with the
// same weights, in float64: grouped-query attention (4 query heads over 2 key-value heads, so each rank
// holds one key-value head and its two query heads), heads of 6 wider than hidden / heads, q/k/v biases,
// Qwen3's per-head q/k norms (one weight for every head: each rank's gradient of it is a partial sum the
// ranks add), llama3 rotary positions, a sliding window of 3 and the SwiGLU MLP.
TEST(NnLayersTest, TensorParallelLlamaBlockEqualsSerialOnTwoRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  const parallel::TensorParallel tp = one_dimensional_on_world();
  nn::TransformerBlockSpec spec;
  spec.hidden = 8;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 6;
  spec.intermediate = 10;
  spec.activation = nn::Activation::kSilu;
  spec.gated_mlp = true;
  spec.rms_norm = true;
  spec.causal = true;
  spec.out_bias = spec.mlp_bias = false;
  spec.qk_norm = true;
  spec.rotary = nn::RotarySpec{6, 100.0, "llama3", 4.0, 1.0, 4.0, 8, 0};
  spec.window = 3;
  spec.names = {"input_layernorm", "post_attention_layernorm", "", "self_attn.q_proj", "self_attn.k_proj",
                "self_attn.v_proj", "self_attn.q_norm", "self_attn.k_norm", "self_attn.o_proj", "mlp.up_proj",
                "mlp.down_proj", "mlp.gate_proj"};
  nn::TransformerBlock serial(spec, parallel::ModelOptions{}), sharded(spec, parallel::ModelOptions{tp});
  serial->to(torch::kFloat64);
  sharded->to(torch::kFloat64);
  torch::manual_seed(13);  // every rank draws the same weights and inputs
  const auto layouts = parallel::collect_layouts(*sharded);
  std::vector<testing::BoundParam> bound;
  auto local = sharded->named_parameters();
  for (const auto& item : serial->named_parameters()) {
    const torch::Tensor full = testing::randn64(item.value().sizes()) * 0.5 + (item.key().find("norm") != std::string::npos ? 1.0 : 0.0);
    {
      torch::NoGradGuard no_grad;
      item.value().copy_(full);
    }
    const auto layout = layouts.count(item.key()) ? layouts.at(item.key()) : parallel::Layout{};
    torch::Tensor* block = local.find(item.key());
    ASSERT_TRUE(block) << "the tensor-parallel block has no " << item.key();
    testing::load_block(*block, full, layout, *tp.mesh);
    bound.push_back({item.key(), item.value(), block, layout});
  }
  EXPECT_EQ(bound.size(), local.size());
  EXPECT_TRUE(layouts.count("self_attn.k_proj.weight") && layouts.count("mlp.gate_proj.weight")) << "the layers are not cut";

  const torch::Tensor x0 = testing::randn64({2, 7, spec.hidden});  // [B, T, H]
  const torch::Tensor upstream = testing::randn64({2, 7, spec.hidden});
  auto run = [&](nn::TransformerBlock& block, torch::Tensor& x) {
    x = x0.clone().requires_grad_();
    const torch::Tensor y = block->forward(x);
    (y * upstream).sum().backward();
    return y.detach();
  };
  torch::Tensor xs, xp;
  const torch::Tensor ys = run(serial, xs);
  const torch::Tensor yp = run(sharded, xp);
  testing::expect_close(yp, ys, "output", kParallelTolerance);
  testing::expect_close(xp.grad(), xs.grad(), "gradient of x", kParallelTolerance);
  testing::expect_gradients(bound, *tp.mesh, kParallelTolerance);
}

}  // namespace
}  // namespace kuafu

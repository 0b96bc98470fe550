// The training step as a CUDA graph captures it (ModelState::finish_step_on_device: the global norm,
// clipping and AdamW's update on the device, nothing read on the host) against the host's step
// (finish_step), for float32 and for bf16 with float32 masters, with the learning rate warming up and the
// gradients clipped every step. On the CPU the two run different AdamW kernels (Kuafu's vectorised one
// against ATen's fused one): the same formula in float32, rounded differently, so weights and moments
// agree within 1e-6 of their magnitude (measured: 1.5e-7 at most; the weights move by far more, and leaving
// the clipping factor out shows as 2e-3). On a GPU both take ATen's fused kernel
// with the same inputs: bitwise, and the step replayed from a CUDA graph bitwise as the eager one.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "core/train/model_state.h"
#include "core/train/run_folder.h"
#include "core/util/cuda_graph.h"
#include "core/util/device.h"
#include "core/util/error.h"
#include "tests/support/test_util.h"
#include "tests/support/training_runs.h"

namespace kuafu::train {
namespace device_step_test {  // named: a unity build puts other tests' helpers beside these
namespace fs = std::filesystem;

struct MlpImpl : torch::nn::Module {
  MlpImpl() : hidden(register_module("hidden", torch::nn::Linear(4, 8))), head(register_module("head", torch::nn::Linear(8, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::tanh(hidden(x))); }
  torch::nn::Linear hidden, head;
};
TORCH_MODULE(Mlp);

constexpr double kClip = 0.05;  // below every step's norm here: the factor is exercised each step

config::Config step_config(const fs::path& out, const std::string& dtype, const torch::Device& device,
                           const std::vector<std::string>& overrides = {}) {
  config::Schema schema;
  add_runtime_schema(schema);
  add_trainer_schema(schema);
  const std::string text =
      "[train]\nsteps = 4\nbatch_size = 8\nmicro_batch_size = 8\nprogress = \"plain\"\nout_dir = \"" + out.string() +
      "\"\n[optim]\nname = \"adamw\"\nlr = 0.01\nwarmup_steps = 2\nweight_decay = 0.1\ngrad_clip = 0.05\n"
      "[precision]\ndtype = \"" + dtype + "\"\n[runtime]\nthreads = 1\ndevice = \"" + device.str() + "\"\n";
  return config::Config::from_string(text, "step.toml", schema, overrides);
}

// Step `step`'s batch [8, 4], the same for every run.
torch::Tensor batch(int64_t step) {
  torch::manual_seed(100 + static_cast<uint64_t>(step));
  return torch::randn({8, 4});
}

torch::Tensor loss_of(Mlp& model, const torch::Tensor& x) {  // [] float32
  return model(x.to(model->parameters()[0].scalar_type())).to(torch::kFloat32).pow(2).mean();
}

enum class Path { kHost, kDevice, kGraph };

struct Outcome {
  std::vector<double> norms;  // each step's, before clipping
  std::map<std::string, torch::Tensor> weights, optimizer_state;  // on the CPU, float32
};

Outcome train(const std::string& dtype, const torch::Device& device, Path path, const fs::path& out) {
  const config::Config config = step_config(out, dtype, device);
  Runtime runtime = testing::single_runtime();
  runtime.device = device;
  torch::manual_seed(7);
  Mlp model;
  model->to(device);
  RunFolder run(config, runtime, read_train_settings(config), {});
  ModelState state(config, runtime, *model, {});
  EXPECT_FALSE(state.device_step_refusal().has_value());
  std::unique_ptr<CapturedStep> graph;
  const torch::Tensor input = torch::zeros({8, 4}, torch::TensorOptions().device(device));  // a graph's fixed input
  Outcome outcome;
  for (int64_t step = 0; step < 4; ++step) {
    state.start_step(step);
    if (path == Path::kHost) {
      state.begin_backward(true);
      loss_of(model, batch(step).to(device)).backward();
      state.end_backward();
      outcome.norms.push_back(state.grad_norm());
      state.finish_step(outcome.norms.back(), kClip, /*overflow=*/false);
      continue;
    }
    state.prepare_device_step();
    input.copy_(batch(step));
    const auto body = [&] {
      state.begin_backward(true);
      loss_of(model, input).backward();
      state.end_backward();
      return state.finish_step_on_device(kClip);
    };
    if (path == Path::kGraph) {
      if (!graph) graph = std::make_unique<CapturedStep>(device);
      outcome.norms.push_back(graph->run(body).item<double>());
    } else {
      outcome.norms.push_back(body().item<double>());
    }
  }
  for (const auto& p : model->named_parameters()) outcome.weights[p.key()] = p.value().detach().cpu().to(torch::kFloat32);
  for (const auto& [name, tensor] : state.optimizer().state_tensors()) {
    if (name != "step") outcome.optimizer_state[name] = tensor.cpu().to(torch::kFloat32);
  }
  EXPECT_EQ(state.optimizer().steps_taken(), 4);
  return outcome;
}

void expect_close(const std::map<std::string, torch::Tensor>& got, const std::map<std::string, torch::Tensor>& want,
                  double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, tensor] : want) {
    const torch::Tensor other = got.at(name);
    const double scale = tensor.abs().max().item<double>();
    const double diff = (other - tensor).abs().max().item<double>();
    EXPECT_LE(diff, tolerance * scale) << what << " " << name << ": largest difference " << diff << " of " << scale;
  }
}

std::vector<torch::Device> devices() {
  std::vector<torch::Device> out = {torch::kCPU};
  if (cuda_available()) out.emplace_back(torch::kCUDA, 0);
  return out;
}

TEST(DeviceStepTest, StepsAsTheHostStep) {
  const fs::path root = testing::temp_dir("device_step");
  for (const torch::Device& device : devices()) {
    for (const std::string dtype : {"fp32", "bf16"}) {
      SCOPED_TRACE(device.str() + " " + dtype);
      const Outcome host = train(dtype, device, Path::kHost, root / "host");
      const Outcome on_device = train(dtype, device, Path::kDevice, root / "device");
      const double tolerance = device.is_cpu() ? 1e-6 : 0.0;
      ASSERT_EQ(on_device.norms.size(), 4u);
      for (size_t i = 0; i < host.norms.size(); ++i) {
        EXPECT_GT(host.norms[i], kClip) << "step " << i << " would not be clipped";
        EXPECT_NEAR(on_device.norms[i], host.norms[i], tolerance * host.norms[i]) << "step " << i;
      }
      // The first step's gradients come from the same weights: the same norm, to the bit.
      EXPECT_EQ(on_device.norms[0], host.norms[0]);
      expect_close(on_device.weights, host.weights, tolerance, "weights");
      // The moments carry the clipped gradients (Adam's update would hide a wrong factor).
      expect_close(on_device.optimizer_state, host.optimizer_state, tolerance, "optimizer state");
      // The weights moved by far more than the tolerance.
      torch::manual_seed(7);
      Mlp start;
      EXPECT_GT((host.weights.at("head.weight") - start->head->weight.detach()).abs().max().item<double>(), 1e-3);
      if (device.is_cuda()) {
        const Outcome graphed = train(dtype, device, Path::kGraph, root / "graph");
        EXPECT_EQ(graphed.norms, on_device.norms);
        expect_close(graphed.weights, on_device.weights, 0.0, "graph's weights");
        expect_close(graphed.optimizer_state, on_device.optimizer_state, 0.0, "graph's optimizer state");
      }
    }
  }
}

// Non-finite gradients: the update is skipped on the device (weights and moments bit for bit), the gradients
// are zeroed, and the step is taken back from the count.
TEST(DeviceStepTest, NonFiniteGradientsChangeNothing) {
  const fs::path root = testing::temp_dir("device_step_inf");
  const config::Config config = step_config(root, "fp32", torch::kCPU);
  Runtime runtime = testing::single_runtime();
  torch::manual_seed(7);
  Mlp model;
  RunFolder run(config, runtime, read_train_settings(config), {});
  ModelState state(config, runtime, *model, {});
  auto step = [&](double loss_factor) {
    state.start_step(state.optimizer().steps_taken());
    state.prepare_device_step();
    state.begin_backward(true);
    (loss_of(model, batch(0)) * loss_factor).backward();
    state.end_backward();
    return state.finish_step_on_device(kClip).item<double>();
  };
  ASSERT_TRUE(std::isfinite(step(1.0)));
  const auto weights = [&] {
    std::map<std::string, torch::Tensor> out;
    for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
    for (const auto& [name, tensor] : state.optimizer().state_tensors()) out[name] = tensor.clone();
    return out;
  };
  const auto before = weights();
  EXPECT_FALSE(std::isfinite(step(std::numeric_limits<double>::infinity())));
  state.take_back_device_step();
  const auto after = weights();
  for (const auto& [name, tensor] : before) EXPECT_TRUE(torch::equal(after.at(name), tensor)) << name;
  for (const auto& p : model->parameters()) EXPECT_EQ(p.grad().abs().max().item<double>(), 0.0);
  EXPECT_EQ(state.optimizer().steps_taken(), 1);
}

TEST(DeviceStepTest, RefusalsSayWhy) {
  const fs::path root = testing::temp_dir("device_step_refused");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"optim.name=\"sgd\""}, "optimizer sgd"},
      {{"optim.ema_decay=0.9"}, "optim.ema_decay"},
      {{"memory.strategy=\"zero2\""}, "memory.strategy zero2"},
  };
  for (const auto& [overrides, reason] : cases) {
    SCOPED_TRACE(reason);
    const config::Config config = step_config(root, "fp32", torch::kCPU, overrides);
    Runtime runtime = testing::single_runtime();
    Mlp model;
    RunFolder run(config, runtime, read_train_settings(config), {});
    ModelState state(config, runtime, *model, {});
    const auto refusal = state.device_step_refusal();
    ASSERT_TRUE(refusal.has_value());
    EXPECT_TRUE(testing::Contains(*refusal, reason)) << *refusal;
    EXPECT_TRUE(testing::Contains(testing::expected_error([&] { state.prepare_device_step(); }), reason));
  }
  EXPECT_TRUE(testing::Contains(testing::expected_error([] { CapturedStep graph(torch::kCPU); }), "CUDA"));
}

}  // namespace device_step_test
}  // namespace kuafu::train

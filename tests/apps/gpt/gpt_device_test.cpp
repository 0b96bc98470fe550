// Nothing a training step touches leaves the configured device (runtime.device = "auto": the CPU here,
// the local rank's GPU with NCCL on a CUDA machine): parameters, gradients, master weights, optimizer
// state, the batches (through the loss they give) and every collective's tensors (collectives refuse a
// tensor that is not on their group's device). On this CPU-only machine the test pins the CPU path; on a
// GPU it is the check that a run does not silently train on the CPU.
#include <gtest/gtest.h>

#include "core/optim/optimizer.h"
#include "core/util/device.h"
#include "core/util/error.h"
#include "tests/apps/gpt/gpt_training_support.h"
#include "tests/support/devices.h"

namespace kuafu::gpt {
namespace {

// Checks, at every micro-step, that the model's weights and the loss the task computes from its batch
// live on `device`.
struct DeviceCheckingTask : train::TrainTask {
  DeviceCheckingTask(std::unique_ptr<TextTask> inner, torch::Device device) : inner(std::move(inner)), device(device) {}
  torch::nn::Module& model() override { return inner->model(); }
  torch::Tensor loss(int64_t step, int64_t first, int64_t rows) override {
    for (const auto& p : inner->model().named_parameters()) {
      EXPECT_EQ(p.value().device(), device) << "parameter " << p.key() << " at step " << step;
    }
    torch::Tensor l = inner->loss(step, first, rows);
    EXPECT_EQ(l.device(), device) << "loss (from the batch) at step " << step;
    losses += 1;
    return l;
  }
  train::LossSum evaluate(int r, int n) override { return inner->evaluate(r, n); }
  double flops_per_item() const override { return inner->flops_per_item(); }
  int64_t items_per_row() const override { return inner->items_per_row(); }
  std::vector<std::string> checkpoint_keys() const override { return inner->checkpoint_keys(); }
  DeferredWeights deferred_weights() const override { return inner->deferred_weights(); }
  std::unique_ptr<TextTask> inner;
  torch::Device device;
  int losses = 0;
};

void expect_training_stays_on_device(const config::Config& config) {
  train::Runtime runtime = train::start_runtime(config);
  const torch::Device device = resolve_device("auto", runtime.world->env().local_rank);
  ASSERT_EQ(runtime.device, device);
  DeviceCheckingTask task(make_text_task(config, runtime), device);
  train::Trainer trainer(config, runtime, task);
  const train::TrainSummary summary = trainer.run();
  EXPECT_EQ(summary.steps_done, 3);
  EXPECT_GE(task.losses, 3);
  for (const auto& p : task.model().named_parameters()) {
    EXPECT_EQ(p.value().device(), device) << p.key();
    if (p.value().grad().defined()) {
      EXPECT_EQ(p.value().grad().device(), device) << "gradient of " << p.key();
    }
  }
  for (const auto& [name, state] : trainer.optimizer().state_tensors()) {
    if (name == "step") continue;  // the step counter is host metadata for checkpoints
    EXPECT_EQ(state.device(), device) << "optimizer state " << name;
  }
  for (const auto& group : trainer.optimizer().groups()) {
    for (const auto& p : group.params) EXPECT_EQ(p.tensor.device(), device) << "master of " << p.name;
  }
}

TEST_F(GPTTrainingTest, TrainingStaysOnTheConfiguredDevice) {
  expect_training_stays_on_device(make_config(root_, "plain", "train.steps=3\nruntime.device=\"auto\""));
  expect_training_stays_on_device(
      make_config(root_, "bf16_zero2", "train.steps=3\nprecision.dtype=\"bf16\"\nmemory.strategy=\"zero2\"\nruntime.device=\"auto\""));
}

TEST_F(GPTTrainingTest, DataParallelTrainingStaysOnTheConfiguredDevice) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  expect_training_stays_on_device(
      make_config(root_, "dp", "train.steps=3\ntrain.micro_batch_size=2\ndist.timeout_s=30\noptim.grad_clip=1.0"));
}

// The same run on each device, from the same initial weights, gives the CPU's numbers: per-step losses
// and gradient norms, and the final weights. On CI only the CPU runs (it checks the harness); on a GPU
// machine this is the check that the CUDA path trains the same model. Tolerance: float32 on a GPU sums in
// other orders (cuBLAS, fused attention kernels), ~1e-6 relative per operation; 1e-4 after 3 plain SGD
// steps leaves room for that, while a wrong scale, mask or missing term moves the numbers by 1e-2 or more.
TEST_F(GPTTrainingTest, EveryDeviceTrainsAsTheCpuDoes) {
  std::vector<double> cpu_losses, cpu_norms;
  std::vector<torch::Tensor> cpu_initial, cpu_weights;
  for (const torch::Device& device : testing::devices_to_test()) {
    SCOPED_TRACE(device.str());
    const std::string name = "on_" + std::to_string(static_cast<int>(device.type()));
    const config::Config config =
        make_config(root_, name, kPlainSgd + "train.steps=3\nruntime.device=\"" + device.str() + "\"");
    train::Runtime runtime = train::start_runtime(config);
    ASSERT_EQ(runtime.device, device);
    std::unique_ptr<TextTask> task = make_text_task(config, runtime);
    // The model draws its initial weights on its device, and a GPU's generator draws other numbers than
    // the CPU's for the same seed: start from the CPU's.
    std::vector<torch::Tensor> parameters = task->model().parameters();
    if (device.is_cpu()) {
      for (const auto& p : parameters) cpu_initial.push_back(p.detach().clone());
    } else {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < parameters.size(); ++i) parameters[i].copy_(cpu_initial[i]);
    }
    train::Trainer(config, runtime, *task).run();
    const std::vector<double> losses = losses_of(root_ / name / "metrics.jsonl");
    const std::vector<double> norms = testing::grad_norms(root_ / name);
    std::vector<torch::Tensor> weights;
    for (const auto& p : task->model().parameters()) weights.push_back(p.detach().cpu());
    ASSERT_EQ(losses.size(), 3u);
    if (device.is_cpu()) {
      cpu_losses = losses, cpu_norms = norms, cpu_weights = weights;
      continue;
    }
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], cpu_losses[i], 1e-4 * cpu_losses[i]) << "loss of step " << i + 1;
      EXPECT_NEAR(norms[i], cpu_norms[i], 1e-4 * cpu_norms[i]) << "gradient norm of step " << i + 1;
    }
    EXPECT_LT(max_difference(weights, cpu_weights), 1e-5);
  }
}

// The model makes each parameter on the device it is given (no copy through the CPU): on the meta
// device, which has no storage, every parameter must be a meta tensor.
TEST_F(GPTTrainingTest, TheModelMakesEveryParameterOnTheGivenDevice) {
  const GPTConfig config = model_config(make_config(root_, "meta", ""));
  const auto on_meta = parallel::ModelOptions::serial_on(torch::kMeta);
  GPT model(config, on_meta);
  int64_t count = 0;
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(p.value().is_meta()) << p.key() << " on " << p.value().device();
    ++count;
  }
  EXPECT_EQ(count, 4 + 12 * config.n_layer);  // wte, wpe, ln_f weight and bias; 12 per block
}

TEST(DeviceTest, ResolvesTheConfiguredDevice) {
  EXPECT_EQ(resolve_device("cpu", 3), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device("auto", 0), cuda_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU));
  for (const std::string bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""}) {
    try {
      resolve_device(bad, 0);
      FAIL() << "accepted \"" << bad << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("runtime.device"), std::string::npos) << e.what();
    }
  }
  if (!cuda_available()) {
    EXPECT_THROW(resolve_device("cuda", 0), Error);
    return;
  }
  // More ranks on a node than GPUs: "auto" names the key and the count instead of leaving CUDA's
  // "invalid device ordinal" to a later call.
  const int gpus = static_cast<int>(torch::cuda::device_count());
  for (const std::string& spec : std::vector<std::string>{"auto", "cuda", "cuda:" + std::to_string(gpus)}) {
    try {
      resolve_device(spec, gpus);
      FAIL() << "\"" << spec << "\" accepted local rank " << gpus << " with " << gpus << " GPU(s)";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("runtime.device"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("shows " + std::to_string(gpus) + " GPU"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kuafu::gpt

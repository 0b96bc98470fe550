// A run of four models through the one trainer, PPO-shaped: a policy and a value model trained with
// different learning rates, schedules and memory strategies (their own [models.<name>.*] sections), a
// frozen reference policy offloaded to host memory block by block, and a frozen reward model held in
// bf16. One checkpoint holds all four; a run stopped by SIGTERM between the micro-steps of step 3 of 6
// and resumed ends bitwise where the straight run ends; and each trained model's weights equal those
// the single-model trainer gives it alone with the same settings (its loss reads only the frozen
// models, so its update is its own).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "core/hooks/block_sites.h"
#include "core/io/safetensors.h"
#include "core/memory/frozen_offload.h"
#include "core/train/model_state.h"
#include "core/train/run_folder.h"
#include "core/train/step_loop.h"
#include "core/train/trainer.h"
#include "core/util/error.h"
#include "tests/support/test_util.h"
#include "tests/support/training_runs.h"

namespace kuafu::train {
namespace {
namespace fs = std::filesystem;
using hooks::Tensors;

// Maths only: a policy over 3 actions, a value model, and a reward model scoring a state and an action;
// its two layers are its blocks (frozen-weight offload brings each in around its call).
struct MlpImpl : torch::nn::Module, hooks::SiteModel {
  MlpImpl(int64_t in, int64_t out) : hidden(register_module("hidden", torch::nn::Linear(in, 8))),
                                     head(register_module("head", torch::nn::Linear(8, out))) {
    sites = hooks::BlockSites(*this, {"hidden", "head"});
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = sites.call(*hidden, x, [this](const torch::Tensor& in) { return torch::tanh(hidden(in)); });
    return sites.call(*head, h, [this](const torch::Tensor& in) { return head(in); });
  }
  torch::nn::Module& module() override { return *this; }
  hooks::BlockSites& block_sites() override { return sites; }
  torch::nn::Linear hidden, head;
  hooks::BlockSites sites;
};
TORCH_MODULE(Mlp);

struct Models {
  Mlp policy{nullptr}, value{nullptr}, reference{nullptr}, reward{nullptr};
  explicit Models(uint64_t seed) {
    torch::manual_seed(seed);
    policy = Mlp(4, 3), value = Mlp(4, 1), reference = Mlp(4, 3), reward = Mlp(7, 1);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < policy->parameters().size(); ++i) {
      reference->parameters()[i].copy_(policy->parameters()[i]);  // the policy PPO starts from
    }
  }
};

std::function<bool(hooks::BlockHooks*)> hooks_of(Mlp& model) {
  return [model](hooks::BlockHooks* hooks) mutable {
    model->set_block_hooks(hooks);
    return true;
  };
}

// A micro-step's rollout: 8 states drawn from (step, first row) alone, so a resumed run sees the same
// ones; actions sampled from the policy and from the reference; the frozen models' scores; the losses of
// both trained models.
struct Rollout {
  torch::Tensor policy_loss, value_loss;
};

Rollout rollout(Models& m, int64_t step, int64_t first_row, int64_t rows) {
  auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 * step + first_row));
  const torch::Tensor states = torch::randn({rows, 4}, generator, torch::kFloat32);
  // The reward model computes in bf16 (its precision section).
  auto reward_of = [&](const torch::Tensor& actions) {
    const torch::Tensor scored = torch::cat({states, torch::one_hot(actions.squeeze(1), 3).to(torch::kFloat32)}, 1);
    return m.reward(scored.to(m.reward->head->weight.scalar_type())).to(torch::kFloat32);
  };
  torch::Tensor actions, old_logp, ref_logp, reward, ref_reward;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor logp = torch::log_softmax(m.policy(states), 1);
    actions = torch::multinomial(logp.exp(), 1, /*replacement=*/false, generator);
    old_logp = logp.gather(1, actions);
    const torch::Tensor ref_all = torch::log_softmax(m.reference(states), 1);
    ref_logp = ref_all.gather(1, actions);
    reward = reward_of(actions);
    // The value model learns the reward of the reference policy's actions: its loss reads only frozen
    // models, so its update is its own (the single-model comparison below).
    ref_reward = reward_of(torch::multinomial(ref_all.exp(), 1, /*replacement=*/false, generator));
  }
  // Clipped surrogate against the batch's mean reward, with a KL penalty to the reference policy.
  const torch::Tensor advantage = reward - reward.mean();
  const torch::Tensor logp = torch::log_softmax(m.policy(states), 1).gather(1, actions);
  const torch::Tensor ratio = (logp - old_logp).exp();
  return {-torch::min(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean() + 0.1 * (logp - ref_logp).mean(),
          (m.value(states) - ref_reward).pow(2).mean()};
}

struct PpoTask : RunTask {
  explicit PpoTask(uint64_t seed) : m(seed) {}
  std::vector<RunModel> models() override {
    auto trained = [](std::string name, torch::nn::Module* module) {
      RunModel model;
      model.name = std::move(name);
      model.module = module;
      return model;
    };
    auto frozen = [](std::string name, Mlp& model) {
      RunModel run_model;
      run_model.name = std::move(name);
      run_model.module = model.get();
      run_model.trained = false;
      run_model.set_block_hooks = hooks_of(model);  // memory.offload_frozen brings its blocks in
      return run_model;
    };
    return {trained("policy", m.policy.get()), trained("value", m.value.get()), frozen("reference", m.reference),
            frozen("reward", m.reward)};
  }
  std::map<std::string, torch::Tensor> losses(int64_t step, int64_t first_row, int64_t rows) override {
    if (stop_in_step == step && first_row == 0) std::raise(SIGTERM);  // during the step's first micro-step
    const Rollout r = rollout(m, step, first_row, rows);
    return {{"policy", r.policy_loss}, {"value", r.value_loss}};
  }
  LossSum evaluate(int, int) override {
    const Rollout r = rollout(m, 99, 0, 8);
    return {r.value_loss.item<double>() * 8, 8, 0, {}};
  }
  double flops_per_item() const override { return 0; }
  int64_t items_per_row() const override { return 1; }
  std::string item_name() const override { return "states"; }
  std::vector<std::string> checkpoint_keys() const override { return {"optim."}; }
  Models m;
  std::optional<int64_t> stop_in_step;
};

// One trained model alone through the single-model trainer, the frozen ones computed as the run
// computes them (the reward model in bf16).
struct AloneTask : TrainTask {
  AloneTask(std::string trained, uint64_t seed) : trained(std::move(trained)), m(seed) {
    m.reward->to(torch::kBFloat16);
    for (auto& p : m.reference->parameters()) p.requires_grad_(false);
    for (auto& p : m.reward->parameters()) p.requires_grad_(false);
    Mlp other = this->trained == "policy" ? m.value : m.policy;
    for (auto& p : other->parameters()) p.requires_grad_(false);
  }
  torch::nn::Module& model() override { return trained == "policy" ? *m.policy : *m.value; }
  torch::Tensor loss(int64_t step, int64_t first_row, int64_t rows) override {
    const Rollout r = rollout(m, step, first_row, rows);
    return trained == "policy" ? r.policy_loss : r.value_loss;
  }
  LossSum evaluate(int, int) override { return {1, 1, 0, {}}; }
  double flops_per_item() const override { return 0; }
  int64_t items_per_row() const override { return 1; }
  std::vector<std::string> checkpoint_keys() const override { return {}; }
  std::string trained;
  Models m;
};

config::Schema ppo_schema() {
  config::Schema schema;
  add_runtime_schema(schema);
  add_trainer_schema(schema);
  add_model_sections(schema, {"policy", "value", "reference", "reward"});
  return schema;
}

// 6 steps of 2 micro-steps. The policy: AdamW at 0.01 with a cosine schedule; the value model: SGD at
// 0.05 with a linear one under ZeRO-2; the reference offloaded; the reward model in bf16.
const char* kPpoSections =
    "[models.policy.optim]\nname = \"adamw\"\nlr = 0.01\nschedule = \"cosine\"\nmin_lr = 0.001\n"
    "[models.value.optim]\nname = \"sgd\"\nlr = 0.05\nmomentum = 0.9\nschedule = \"linear\"\nmin_lr = 0.0\n"
    "[models.value.memory]\nstrategy = \"zero2\"\n"
    "[models.reference.memory]\noffload_frozen = true\n"
    "[models.reward.precision]\ndtype = \"bf16\"\n";

std::string base_text(const fs::path& out) {
  return "[train]\nsteps = 6\nbatch_size = 16\nmicro_batch_size = 8\ncheckpoint_interval = 2\nprogress = \"plain\"\n"
         "out_dir = \"" + out.string() +
         "\"\n[optim]\nname = \"adamw\"\nlr = 0.003\nwarmup_steps = 1\ngrad_clip = 1.0\n"
         "[runtime]\nthreads = 1\ndevice = \"cpu\"\n";
}

config::Config ppo_config(const fs::path& out, const std::vector<std::string>& overrides = {}) {
  return config::Config::from_string(base_text(out) + kPpoSections, "ppo.toml", ppo_schema(), overrides);
}

void train_ppo(const config::Config& config, uint64_t seed, std::optional<int64_t> stop_in_step = std::nullopt) {
  Runtime runtime = testing::single_runtime();
  PpoTask task(seed);
  task.stop_in_step = stop_in_step;
  Trainer(config, runtime, task).run();
  clear_stop_request();
}

io::SafetensorsFile saved(const fs::path& out, const std::string& file, int step = 6) {
  return io::load_safetensors((fs::path(checkpoint_folder((out / "checkpoints").string(), step)) / file).string());
}

void expect_equal_files(const io::SafetensorsFile& actual, const io::SafetensorsFile& expected, const std::string& what) {
  ASSERT_EQ(actual.tensors.size(), expected.tensors.size()) << what;
  for (const auto& [name, tensor] : expected.tensors) {
    const torch::Tensor* other = actual.find(name);
    ASSERT_NE(other, nullptr) << what << " lacks " << name;
    EXPECT_TRUE(torch::equal(tensor, *other)) << what << ": " << name << " differs";
  }
}

const std::vector<std::string> kFiles = {"policy.model.safetensors", "policy.optimizer.safetensors",
                                         "value.model.safetensors",  "value.optimizer.safetensors",
                                         "reference.model.safetensors", "reward.model.safetensors"};

TEST(MultiModelTest, FourModelsStopBetweenMicroStepsAndResumeExactly) {
  const fs::path root = testing::temp_dir("ppo");
  train_ppo(ppo_config(root / "straight"), 7);
  train_ppo(ppo_config(root / "resumed"), 7, /*stop_in_step=*/2);
  ASSERT_FALSE(fs::exists(checkpoint_folder((root / "resumed" / "checkpoints").string(), 6))) << "the stop did not stop";
  const std::string stopped = checkpoint_folder((root / "resumed" / "checkpoints").string(), 2);
  ASSERT_TRUE(fs::exists(stopped)) << "the stop inside step 3 saves the weights of step 2";
  train_ppo(ppo_config(root / "resumed"), /*other initial weights, replaced by the checkpoint's*/ 99);

  for (const auto& file : kFiles) EXPECT_TRUE(fs::exists(fs::path(stopped) / file)) << file;
  EXPECT_FALSE(fs::exists(fs::path(stopped) / "reference.optimizer.safetensors")) << "a frozen model has no optimizer";
  for (const auto& file : kFiles) expect_equal_files(saved(root / "resumed", file), saved(root / "straight", file), file);
  // The reward model is held in bf16, the others in float32.
  EXPECT_EQ(saved(root / "straight", "reward.model.safetensors").find("head.weight")->scalar_type(), torch::kBFloat16);
  EXPECT_EQ(saved(root / "straight", "reference.model.safetensors").find("head.weight")->scalar_type(), torch::kFloat32);
  // Each model's figures, under its name, and the same losses after the resume.
  const auto straight = testing::metric_lines(root / "straight" / "metrics.jsonl");
  const auto resumed = testing::metric_lines(root / "resumed" / "metrics.jsonl");
  ASSERT_EQ(straight.size(), 6u);
  ASSERT_EQ(resumed.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    for (const char* key : {"policy.loss", "value.loss", "policy.lr", "value.lr", "policy.grad_norm", "value.grad_norm"}) {
      ASSERT_TRUE(resumed[i].contains(key)) << key;
      EXPECT_EQ(resumed[i][key], straight[i][key]) << key << " at step " << i + 1;
    }
  }
  // The sections gave each model its own rate and schedule. Step 4 of 6, one warm-up step: 2 of the 5
  // decay steps done, progress 0.4.
  EXPECT_NEAR(straight[3]["policy.lr"].get<double>(), 0.001 + 0.5 * (0.01 - 0.001) * (1 + std::cos(M_PI * 0.4)), 1e-12);
  EXPECT_NEAR(straight[3]["value.lr"].get<double>(), 0.05 * (1 - 0.4), 1e-12);
  // The models moved: a resume that restored nothing would not be compared against a standing start.
  EXPECT_FALSE(torch::equal(*saved(root / "straight", "policy.model.safetensors").find("head.weight"),
                            *saved(root / "straight", "policy.model.safetensors", 2).find("head.weight")));
}

// The reference model's offloaded weights in files on the disk tier (memory.disk_dir) instead of host
// memory: the same steps and checkpoints bit for bit, through a stop and a resume (its checkpoint saved from
// the files and loaded back into them over other initial weights), and no scratch folder left behind.
TEST(MultiModelTest, AReferenceOnTheDiskTrainsAsOneInHostMemory) {
  const fs::path root = testing::temp_dir("ppo_disk");
  const fs::path disk = root / "disk";
  fs::create_directories(disk);
  const std::vector<std::string> on_disk{"models.reference.memory.disk_dir=\"" + disk.string() + "\""};
  train_ppo(ppo_config(root / "host"), 7);
  train_ppo(ppo_config(root / "on_disk", on_disk), 7, /*stop_in_step=*/2);
  ASSERT_TRUE(fs::exists(checkpoint_folder((root / "on_disk" / "checkpoints").string(), 2)));
  train_ppo(ppo_config(root / "on_disk", on_disk), /*other initial weights, replaced by the checkpoint's*/ 99);
  for (const auto& file : kFiles) expect_equal_files(saved(root / "on_disk", file), saved(root / "host", file), file);
  const auto host = testing::metric_lines(root / "host" / "metrics.jsonl");
  const auto resumed = testing::metric_lines(root / "on_disk" / "metrics.jsonl");
  ASSERT_EQ(resumed.size(), host.size());
  for (size_t i = 0; i < host.size(); ++i) EXPECT_EQ(resumed[i]["policy.loss"], host[i]["policy.loss"]) << "step " << i + 1;
  EXPECT_TRUE(fs::is_empty(disk)) << "each run removes its scratch folder";
  // The key holds frozen weights only, for now.
  std::string misplaced = "no error";
  try {
    train_ppo(ppo_config(root / "misplaced", {"models.policy.memory.disk_dir=\"" + disk.string() + "\""}), 7);
  } catch (const Error& e) {
    misplaced = e.what();
  }
  EXPECT_NE(misplaced.find("memory.disk_dir"), std::string::npos) << misplaced;
}

// On the disk tier a frozen parameter is its shape without memory between its block's calls, its values
// are in its file (and come back whole for a checkpoint), and the offload's end brings them back.
TEST(MultiModelTest, FrozenWeightsOnTheDiskLeaveTheirShapeBehind) {
  const fs::path disk = testing::temp_dir("frozen_disk");
  Mlp model(4, 3);
  for (auto& p : model->parameters()) p.requires_grad_(false);
  const io::NamedTensors before = named_weights(*model);
  std::map<std::string, torch::Tensor> values;
  for (const auto& [name, t] : before) values[name] = t.clone();
  {
    memory::DiskTierOptions options;
    options.dir = disk.string();
    memory::FrozenWeightOffload offload(*model, torch::kCPU, options);
    EXPECT_TRUE(offload.on_disk());
    EXPECT_EQ(offload.host_bytes(), 0);
    int64_t bytes = 0;
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.storage().nbytes(), 0u);
      bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
    EXPECT_EQ(offload.disk_bytes(), bytes);
    for (const auto& [name, t] : offload.with_values_from_disk(named_weights(*model))) {
      EXPECT_TRUE(torch::equal(t, values.at(name))) << name;
    }
  }
  for (const auto& [name, t] : named_weights(*model)) EXPECT_TRUE(torch::equal(t, values.at(name))) << name;
  EXPECT_TRUE(fs::is_empty(disk));
}

// On the disk tier the call that followed a block's call last time has its weights read while the block
// computes: from the second pass on every call finds them read, and a call out of the usual order (its
// read-ahead dropped) still gets its own values.
TEST(MultiModelTest, FrozenWeightsOnTheDiskAreReadAheadInTheOrderTheBlocksRan) {
  const fs::path disk = testing::temp_dir("frozen_read_ahead");
  torch::nn::Sequential model(torch::nn::Linear(4, 5), torch::nn::Linear(5, 6), torch::nn::Linear(6, 3));
  for (auto& p : model->parameters()) p.requires_grad_(false);
  std::map<std::string, torch::Tensor> values;
  for (const auto& [name, t] : named_weights(*model)) values[name] = t.clone();
  memory::DiskTierOptions options;
  options.dir = disk.string();
  memory::FrozenWeightOffload offload(*model, torch::kCPU, options);
  const auto call = [&](int64_t i) {
    const hooks::BlockCall block{"block." + std::to_string(i), {model[static_cast<size_t>(i)].get()}};
    offload.pre_forward(block);
    for (const auto& item : model[static_cast<size_t>(i)]->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), values.at(std::to_string(i) + "." + item.key()))) << i << " " << item.key();
    }
    offload.post_forward(block);
  };
  for (int64_t i = 0; i < 3; ++i) call(i);
  EXPECT_EQ(offload.calls_read_ahead(), 0);  // the first pass learns the order
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t i = 0; i < 3; ++i) call(i);
  EXPECT_EQ(offload.calls_read_ahead(), 5);  // all but the second pass's first (block 2's successor was unknown)
  call(1);                                   // block 0 was read ahead: dropped
  EXPECT_EQ(offload.calls_read_ahead(), 5);
  call(2);  // as after block 1 last time
  EXPECT_EQ(offload.calls_read_ahead(), 6);
}

TEST(MultiModelTest, EachTrainedModelStepsAsTheSingleModelTrainerWould) {
  const fs::path root = testing::temp_dir("ppo_alone");
  train_ppo(ppo_config(root / "together"), 7);
  // The policy alone: its section's keys as top-level keys.
  config::Schema schema;
  add_runtime_schema(schema);
  add_trainer_schema(schema);
  const std::vector<std::pair<std::string, std::vector<std::string>>> alone = {
      {"policy", {"optim.name=\"adamw\"", "optim.lr=0.01", "optim.schedule=\"cosine\"", "optim.min_lr=0.001"}},
      {"value", {"optim.name=\"sgd\"", "optim.lr=0.05", "optim.momentum=0.9", "optim.schedule=\"linear\"",
                 "optim.min_lr=0.0", "memory.strategy=\"zero2\""}},
  };
  for (const auto& [name, overrides] : alone) {
    SCOPED_TRACE(name);
    const config::Config config =
        config::Config::from_string(base_text(root / name), name + ".toml", schema, overrides);
    Runtime runtime = testing::single_runtime();
    AloneTask task(name, 7);
    Trainer(config, runtime, task).run();
    expect_equal_files(saved(root / name, "model.safetensors"), saved(root / "together", name + ".model.safetensors"),
                       name + " alone vs together");
  }
}

TEST(MultiModelTest, ModelSectionsAreCheckedAsTheTopLevelKeys) {
  const fs::path root = testing::temp_dir("ppo_keys");
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { ppo_config(root, {"models.critic.optim.lr=0.1"}); }),
                                "models.critic.optim.lr"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { ppo_config(root, {"models.value.optim.lr=-1"}); }),
                                "models.value.optim.lr"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { ppo_config(root, {"models.value.optim.nme=\"sgd\""}); }),
                                "did you mean 'models.value.optim.name'"));
  // A view reads its own keys, the top-level ones otherwise, and errors name where a key was set.
  const config::Config config = ppo_config(root);
  const config::Config value = config.model_view("value");
  EXPECT_EQ(value.get_string("optim.name"), "sgd");
  EXPECT_EQ(value.get_float("optim.grad_clip"), 1.0);
  EXPECT_EQ(config.model_view("reference").get_string("optim.name"), "adamw");
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { value.fail_at("optim.lr", "is wrong"); }),
                                "models.value.optim.lr at ppo.toml:"));
}

// optim.ema_decay keeps ema = d ema + (1 - d) w after each step, worked here by hand from the weights;
// for plain replicas and for ZeRO-2's sharded masters alike; saved as the "ema" part and restored by a
// resume; swapped into the model and back. The average is float32 arithmetic in the same order as the
// formula: 1e-6 relative.
TEST(MultiModelTest, EmaFollowsTheWeightsAndResumes) {
  const fs::path root = testing::temp_dir("ema");
  for (const std::string strategy : {"none", "zero2"}) {
    SCOPED_TRACE(strategy);
    const config::Config config =
        ppo_config(root / strategy, {"optim.ema_decay=0.9", "memory.strategy=\"" + strategy + "\""});
    Runtime runtime = testing::single_runtime();
    torch::manual_seed(3);
    Mlp model(4, 3);
    std::map<std::string, torch::Tensor> expected;
    for (const auto& p : model->named_parameters()) expected[p.key()] = p.value().detach().clone();
    {
      RunFolder run(config, runtime, read_train_settings(config), {});
      ModelState state(config, runtime, *model, {});
      for (int64_t step = 0; step < 3; ++step) {
        state.start_step(step);
        state.begin_backward(true);
        model(torch::randn({8, 4})).pow(2).mean().backward();
        state.end_backward();
        state.finish_step(state.grad_norm(), 0.0, false);
        for (const auto& p : model->named_parameters()) {
          expected[p.key()] = 0.9 * expected[p.key()] + 0.1 * p.value().detach();
        }
      }
      const io::NamedTensors ema = state.full_ema();
      ASSERT_EQ(ema.size(), expected.size());
      for (const auto& [name, tensor] : ema) {
        EXPECT_TRUE(torch::allclose(tensor, expected.at(name), 1e-6, 0)) << name;
      }
      // swap_ema gives the model the average (as evaluation wants), and a second call the weights back, bit for bit.
      std::map<std::string, torch::Tensor> live;
      for (const auto& p : model->named_parameters()) live[p.key()] = p.value().detach().clone();
      state.swap_ema();
      for (const auto& p : model->named_parameters()) EXPECT_TRUE(torch::allclose(p.value(), expected.at(p.key()), 1e-6, 0)) << p.key();
      state.swap_ema();
      for (const auto& p : model->named_parameters()) EXPECT_TRUE(torch::equal(p.value(), live.at(p.key()))) << p.key();
      for (const auto& [name, tensor] : state.full_ema()) EXPECT_TRUE(torch::allclose(tensor, expected.at(name), 1e-6, 0)) << name;
      run.save(3, state.checkpoint_parts(), nlohmann::json::object());
    }
    const std::string folder = checkpoint_folder((root / strategy / "checkpoints").string(), 3);
    const io::SafetensorsFile saved = io::load_safetensors(folder + "/ema.model.safetensors");
    for (const auto& [name, tensor] : expected) EXPECT_TRUE(torch::allclose(*saved.find(name), tensor, 1e-6, 0)) << name;
    // A resume restores the average, not a fresh copy of the weights.
    torch::manual_seed(4);
    Mlp fresh(4, 3);
    RunFolder run(config, runtime, read_train_settings(config), {});
    ModelState resumed(config, runtime, *fresh, {});
    const auto resume = run.checkpoint_to_resume();
    ASSERT_TRUE(resume);
    resumed.load(resume->folder, resume->trainer_state);
    for (const auto& [name, tensor] : resumed.full_ema()) EXPECT_TRUE(torch::equal(tensor, *saved.find(name))) << name;
  }
}

// optim.ema_warmup = "diffusers": the k-th update keeps min(ema_decay, (1 + s)/(10 + s)) of the average, s = k − 1,
// the first copying the weights (diffusers' EMAModel.get_decay, worked here by hand); the count of updates is
// saved in the trainer state, so a resumed run's fourth update decays by 4/13 as an unbroken run's. 1e-6 relative
// as above.
// One step of `m` and its moving average against the average worked here with the decay `decay_of(step)` (the
// first step's copies the weights), 1e-6 relative.
void step_and_expect_ema(ModelState& state, Mlp& m, int64_t step, const std::function<double(double)>& decay_of,
                         std::map<std::string, torch::Tensor>& expected) {
  state.start_step(step);
  state.begin_backward(true);
  m(torch::randn({8, 4})).pow(2).mean().backward();
  state.end_backward();
  state.finish_step(state.grad_norm(), 0.0, false);
  const double decay = step == 0 ? 0.0 : decay_of(static_cast<double>(step));  // update step + 1, diffusers' step = update − 1
  for (const auto& p : m->named_parameters()) {
    const torch::Tensor w = p.value().detach().clone();
    expected[p.key()] = step == 0 ? w : decay * expected[p.key()] + (1 - decay) * w;
  }
  for (const auto& [name, tensor] : state.full_ema()) EXPECT_TRUE(torch::allclose(tensor, expected.at(name), 1e-6, 0)) << step << " " << name;
}

TEST(MultiModelTest, EmaWarmsUpAsDiffusersAndResumesItsCount) {
  const fs::path root = testing::temp_dir("ema_warmup");
  const config::Config config = ppo_config(root, {"optim.ema_decay=0.9", "optim.ema_warmup=\"diffusers\""});
  Runtime runtime = testing::single_runtime();
  torch::manual_seed(3);
  Mlp model(4, 3);
  std::map<std::string, torch::Tensor> expected;
  const auto step_and_expect = [&](ModelState& state, Mlp& m, int64_t step) {
    step_and_expect_ema(state, m, step, [](double s) { return std::min(0.9, (1 + s) / (10 + s)); }, expected);
  };
  {
    RunFolder run(config, runtime, read_train_settings(config), {});
    ModelState state(config, runtime, *model, {});
    for (int64_t step = 0; step < 3; ++step) step_and_expect(state, model, step);
    nlohmann::json trainer_state = nlohmann::json::object();
    state.save_scaler_state(trainer_state);
    EXPECT_EQ(trainer_state.at("ema_updates"), 3);
    run.save(3, state.checkpoint_parts(), trainer_state);
  }
  RunFolder run(config, runtime, read_train_settings(config), {});
  ModelState resumed(config, runtime, *model, {});
  const auto resume = run.checkpoint_to_resume();
  ASSERT_TRUE(resume);
  resumed.load(resume->folder, resume->trainer_state);
  step_and_expect(resumed, model, 3);
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] {
                                  ppo_config(root / "bad", {"optim.ema_decay=0.9", "optim.ema_warmup=\"karras\""});
                                }),
                                "optim.ema_warmup"));
}

// optim.ema_warmup = "power" (diffusers' EMAModel with use_ema_warmup, inv_gamma 2, power 3/4): the k-th update keeps
// min(ema_decay, 1 − (1 + s/2)^−3/4) of the average, s = k − 1 (EMAModel.get_decay worked here by hand); the decay
// of the 0.999 asked for is not reached in these steps, so the warm-up is what is checked.
TEST(MultiModelTest, EmaWarmsUpByPowerAsDiffusersUseEmaWarmup) {
  const fs::path root = testing::temp_dir("ema_power");
  const config::Config config = ppo_config(
      root, {"optim.ema_decay=0.999", "optim.ema_warmup=\"power\"", "optim.ema_inv_gamma=2", "optim.ema_power=0.75"});
  Runtime runtime = testing::single_runtime();
  torch::manual_seed(4);
  Mlp model(4, 3);
  std::map<std::string, torch::Tensor> expected;
  RunFolder run(config, runtime, read_train_settings(config), {});
  ModelState state(config, runtime, *model, {});
  for (int64_t step = 0; step < 4; ++step) {
    step_and_expect_ema(state, model, step, [](double s) { return std::min(0.999, 1 - std::pow(1 + s / 2, -0.75)); }, expected);
  }
}

}  // namespace
}  // namespace kuafu::train

// A training loop with two trained models and two frozen ones, PPO-shaped, written from the trainer's
// parts (ModelState per trained model, RunFolder for the run's folder and checkpoints, StepLoop for
// progress, metrics and stop signals): one checkpoint holds all four, and a run stopped by a signal
// during step 3 of 6 and resumed ends bitwise where the straight run ends (weights and optimizer state
// of both trained models), the rollouts' random draws included, with the same metrics lines.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "core/io/safetensors.h"
#include "core/train/model_state.h"
#include "core/train/run_folder.h"
#include "core/train/step_loop.h"
#include "core/train/trainer.h"
#include "core/util/error.h"
#include "tests/support/training_runs.h"

namespace kuafu::train {
namespace {
namespace fs = std::filesystem;

// Maths only: a policy over 3 actions, a value model, and a reward model scoring a state and an action.
struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t out) : hidden(register_module("hidden", torch::nn::Linear(in, 8))),
                                     head(register_module("head", torch::nn::Linear(8, out))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::tanh(hidden(x))); }
  torch::nn::Linear hidden, head;
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

config::Config ppo_config(const fs::path& out, const std::vector<std::string>& overrides = {}) {
  config::Schema schema;
  add_runtime_schema(schema);
  add_trainer_schema(schema);
  const std::string text = "[train]\nsteps = 6\nout_dir = \"" + out.string() + "\"\n"
                           "[optim]\nname = \"adamw\"\nlr = 0.01\nwarmup_steps = 0\ngrad_clip = 1.0\n"
                           "[runtime]\nthreads = 1\ndevice = \"cpu\"\n";
  return config::Config::from_string(text, "ppo.toml", schema, overrides);
}

// Trains from where the run folder's checkpoint left off (or from `seed`'s weights) until train.steps,
// or until a stop signal: `stop_during` raises one (as SIGTERM would) in the middle of that step, which
// the loop finishes, checkpoints and leaves.
void train_ppo(const config::Config& config, uint64_t seed, std::optional<int64_t> stop_during = std::nullopt) {
  Runtime runtime = testing::single_runtime();
  Models m(seed);
  const TrainSettings settings = read_train_settings(config);
  RunFolder run(config, runtime, settings, {"optim."});
  ModelStateOptions policy_options, value_options;
  policy_options.name = "policy", value_options.name = "value";
  policy_options.steps = value_options.steps = settings.steps;
  ModelState policy(config, runtime, *m.policy, policy_options);
  ModelState value(config, runtime, *m.value, value_options);
  int64_t start = 0;
  if (const auto resume = run.checkpoint_to_resume()) {
    policy.load(resume->folder, resume->trainer_state);
    value.load(resume->folder, resume->trainer_state);
    CheckpointStore::load_weights(resume->folder, named_weights(*m.reference), nullptr, "reference");
    CheckpointStore::load_weights(resume->folder, named_weights(*m.reward), nullptr, "reward");
    start = resume->step();
    run.resumed(*resume);
  }
  auto save = [&](int64_t step) {
    nlohmann::json trainer_state = nlohmann::json::object();
    policy.save_scaler_state(trainer_state);
    value.save_scaler_state(trainer_state);
    std::vector<CheckpointPart> parts = policy.checkpoint_parts();
    for (CheckpointPart& part : value.checkpoint_parts()) parts.push_back(std::move(part));
    parts.push_back({"reference", named_weights(*m.reference), {}, ""});
    parts.push_back({"reward", named_weights(*m.reward), {}, ""});
    run.save(step, parts, trainer_state);
  };
  StepLoop loop(settings, runtime, run, start, {"states", 16, 0, torch::kFloat32});
  for (int64_t step = start; step < settings.steps; ++step) {
    loop.begin();
    if (stop_during == step) request_stop();
    // Rollout: states and sampled actions come from the default generator, which the checkpoint keeps.
    const torch::Tensor states = torch::randn({16, 4});
    torch::Tensor actions, old_logp, ref_logp, reward, advantage;
    {
      torch::NoGradGuard no_grad;
      const torch::Tensor logp = torch::log_softmax(m.policy(states), 1);
      actions = torch::multinomial(logp.exp(), 1);
      old_logp = logp.gather(1, actions);
      ref_logp = torch::log_softmax(m.reference(states), 1).gather(1, actions);
      reward = m.reward(torch::cat({states, torch::one_hot(actions.squeeze(1), 3).to(torch::kFloat32)}, 1));
      advantage = reward - m.value(states);
    }
    // Clipped surrogate with a KL penalty to the reference policy; the value model regresses the reward.
    const torch::Tensor logp = torch::log_softmax(m.policy(states), 1).gather(1, actions);
    const torch::Tensor ratio = (logp - old_logp).exp();
    const torch::Tensor policy_loss =
        -torch::min(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean() + 0.1 * (logp - ref_logp).mean();
    const torch::Tensor value_loss = (m.value(states) - reward).pow(2).mean();
    bool non_finite = false;
    for (auto [state, loss] : {std::pair<ModelState*, torch::Tensor>{&policy, policy_loss}, {&value, value_loss}}) {
      state->start_step(step);
      state->begin_backward(/*last=*/true);
      (loss * state->loss_scale()).backward();
      state->end_backward();
      const double norm = state->grad_norm();
      non_finite = non_finite || !std::isfinite(norm);
      state->finish_step(norm, settings.grad_clip, !std::isfinite(norm));
    }
    const StepOutcome outcome = loop.agree(policy_loss.item<double>(), non_finite);
    ASSERT_FALSE(outcome.non_finite);
    loop.end(step, {{"policy_loss", outcome.loss}, {"value_loss", value_loss.item<double>()}},
             "policy loss " + fixed(outcome.loss, 4));
    if (loop.checkpoint_due(step, outcome.stop)) save(step + 1);
    if (outcome.stop) {
      clear_stop_request();
      return;
    }
  }
}

io::SafetensorsFile saved(const fs::path& out, const std::string& file) {
  return io::load_safetensors((fs::path(checkpoint_folder((out / "checkpoints").string(), 6)) / file).string());
}

TEST(MultiModelTest, PpoShapedLoopResumesExactlyFromOneCheckpointOfFourModels) {
  const fs::path root = fs::temp_directory_path() / ("kuafu_ppo_" + std::to_string(::getpid()));
  fs::remove_all(root);
  train_ppo(ppo_config(root / "straight"), 7);
  train_ppo(ppo_config(root / "resumed"), 7, /*stop_during=*/2);
  ASSERT_FALSE(fs::exists(checkpoint_folder((root / "resumed" / "checkpoints").string(), 6))) << "the stop did not stop";
  train_ppo(ppo_config(root / "resumed"), /*other initial weights, replaced by the checkpoint's*/ 99);

  const std::string step3 = checkpoint_folder((root / "resumed" / "checkpoints").string(), 3);
  for (const char* file : {"policy.model.safetensors", "policy.optimizer.safetensors", "value.model.safetensors",
                           "value.optimizer.safetensors", "reference.model.safetensors", "reward.model.safetensors"}) {
    EXPECT_TRUE(fs::exists(fs::path(step3) / file)) << file;
  }
  EXPECT_FALSE(fs::exists(fs::path(step3) / "reference.optimizer.safetensors")) << "a frozen model has no optimizer";
  for (const char* file : {"policy.model.safetensors", "policy.optimizer.safetensors", "value.model.safetensors",
                           "value.optimizer.safetensors", "reference.model.safetensors", "reward.model.safetensors"}) {
    SCOPED_TRACE(file);
    const io::SafetensorsFile straight = saved(root / "straight", file), resumed = saved(root / "resumed", file);
    ASSERT_EQ(straight.tensors.size(), resumed.tensors.size());
    for (const auto& [name, tensor] : straight.tensors) {
      const torch::Tensor* other = resumed.find(name);
      ASSERT_NE(other, nullptr) << name;
      EXPECT_TRUE(torch::equal(tensor, *other)) << name << " differs after the resume";
    }
  }
  // metrics.jsonl: one line per step with the loop's own figures and the step loop's, the same losses.
  auto metrics = [&](const char* run) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(root / run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  };
  const auto straight_lines = metrics("straight"), resumed_lines = metrics("resumed");
  ASSERT_EQ(resumed_lines.size(), 6u);
  ASSERT_EQ(straight_lines.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(resumed_lines[i]["step"], static_cast<int64_t>(i + 1));
    EXPECT_EQ(resumed_lines[i]["policy_loss"], straight_lines[i]["policy_loss"]) << "step " << i + 1;
    for (const char* key : {"step_time_s", "states_per_s", "peak_mem_mb"}) EXPECT_TRUE(resumed_lines[i].contains(key)) << key;
  }
  // The models moved: a resume that restored nothing would not be compared against a standing start.
  EXPECT_FALSE(torch::equal(*saved(root / "straight", "policy.model.safetensors").find("head.weight"),
                            *io::load_safetensors(step3 + "/policy.model.safetensors").find("head.weight")));
  // A part the checkpoint does not hold is named.
  Mlp critic(4, 1);
  try {
    CheckpointStore::load_weights(step3, named_weights(*critic), nullptr, "critic");
    FAIL() << "loaded a part that is not there";
  } catch (const kuafu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no model \"critic\""), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

// optim.ema_decay keeps ema = d ema + (1 - d) w after each step, worked here by hand from the weights;
// for plain replicas and for ZeRO-2's sharded masters alike; saved as the "ema" part and restored by a
// resume. The average is float32 arithmetic in the same order as the formula: 1e-6 relative.
TEST(MultiModelTest, EmaFollowsTheWeightsAndResumes) {
  const fs::path root = fs::temp_directory_path() / ("kuafu_ema_" + std::to_string(::getpid()));
  fs::remove_all(root);
  for (const std::string strategy : {"none", "zero2"}) {
    SCOPED_TRACE(strategy);
    const config::Config config = ppo_config(root / strategy, {"optim.ema_decay=0.9", "memory.strategy=\"" + strategy + "\""});
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
  fs::remove_all(root);
}

}  // namespace
}  // namespace kuafu::train

// kuafu-gpt as a user runs it: every shipped config validates, and bad input (config, checkpoint)
// ends with a clear message and a non-zero exit code.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "apps/gpt/app_config.h"
#include "core/io/safetensors.h"
#include "core/io/token_file.h"
#include "core/util/atomic_file.h"
#include "core/util/openmp_env.h"
#include "tests/support/benchmark_line.h"
#include "tests/support/json_lines.h"
#include "tests/support/run_command.h"
#include "tests/support/test_util.h"

namespace kuafu::gpt {
namespace {
namespace fs = std::filesystem;

using Result = testing::CommandResult;

Result run_gpt(const std::string& args) { return testing::run_command(std::string(KUAFU_GPT_PATH) + " " + args); }

using testing::temp_dir;

// Token files of a 64-token vocabulary in `dir` and a config c.toml training a tiny GPT on them for 2
// steps into dir/run; returns " --config <dir>/c.toml".
std::string tiny_run(const fs::path& dir, int layers) {
  std::vector<uint32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 % 64);
  io::write_token_file((dir / "train.tok").string(), tokens, 64);
  io::write_token_file((dir / "val.tok").string(), tokens, 64);
  std::ofstream(dir / "c.toml") << "[model]\nvocab_size = 64\nn_positions = 16\nn_embd = 16\nn_layer = " << layers
                                << "\nn_head = 2\n[data]\ncontext = 8\ndir = \"" << dir.string() << "\"\n"
                                << "[train]\nsteps = 2\nbatch_size = 2\nmicro_batch_size = 2\neval_rows = 2\n"
                                << "out_dir = \"" << (dir / "run").string() << "\"\n[runtime]\nthreads = 1\n";
  return " --config " + (dir / "c.toml").string();
}

TEST(GPTConfigsTest, EveryShippedConfigValidates) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(KUAFU_SOURCE_DIR) / "apps/gpt/configs")) {
    SCOPED_TRACE(entry.path().string());
    const config::Config config = config::Config::load(entry.path().string(), gpt_schema());
    if (config.get_int("model.vocab_size") > 0) {
      const GPTConfig model = model_config(config);  // cross-key checks (heads divide width, context fits)
      EXPECT_GT(model.parameter_count(), 0);
    }
    ++count;
  }
  EXPECT_GE(count, 5);
}

TEST(GPTCliTest, MalformedConfigNamesFileLineAndKey) {
  const auto dir = temp_dir("badconfig");
  std::ofstream(dir / "bad.toml") << "[train]\nsteps = \"many\"\nbatchsize = 4\n";
  const Result result = run_gpt("train --config " + (dir / "bad.toml").string());
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("bad.toml:2"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("train.steps"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("did you mean 'train.batch_size'"), std::string::npos) << result.output;
}

// Evaluation, generation and export make the whole model in float32: one no machine holds (2e13
// parameters) is refused by its keys before anything is built, for each of them (they once built until
// memory ran out), and export writes no folder.
TEST(GPTCliTest, EveryPurposeRefusesAModelTooLargeBeforeBuildingIt) {
  const auto dir = temp_dir("too_large");
  const std::string huge = tiny_run(dir, 2) + " --set model.n_layer=100000 --set model.n_embd=4096 --set model.n_head=32";
  for (const std::string& command : std::vector<std::string>{"eval --checkpoint init", "generate --checkpoint init --prompt x",
                                                             "export --checkpoint init --out " + (dir / "exported").string()}) {
    const Result result = run_gpt(command + huge);
    EXPECT_EQ(result.exit_code, 1) << command;
    EXPECT_NE(result.output.find("model.n_layer = 100000, model.n_embd = 4096"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("float32 weights alone need"), std::string::npos) << result.output;
  }
  EXPECT_FALSE(fs::exists(dir / "exported"));
}

TEST(GPTCliTest, UnknownSubcommandAndHelp) {
  EXPECT_EQ(run_gpt("--help").exit_code, 0);
  const Result result = run_gpt("trian --config x.toml");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("train"), std::string::npos) << result.output;
}

TEST(GPTCliTest, TruncatedCheckpointIsRefusedAndLeftInPlace) {
  const auto dir = temp_dir("truncated");
  const std::string config = tiny_run(dir, 1);
  const Result trained = run_gpt("train" + config);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const fs::path model = dir / "run/checkpoints/step_00000002/model.safetensors";
  ASSERT_TRUE(fs::exists(model));
  fs::resize_file(model, fs::file_size(model) - 100);
  const auto damaged_size = fs::file_size(model);

  const Result evaluated = run_gpt("eval" + config);
  EXPECT_NE(evaluated.exit_code, 0);
  EXPECT_NE(evaluated.output.find("truncated"), std::string::npos) << evaluated.output;
  // Resuming from it fails the same way, and nothing already saved is touched.
  const Result resumed = run_gpt("train" + config + " --set train.steps=4");
  EXPECT_NE(resumed.exit_code, 0);
  EXPECT_NE(resumed.output.find("model.safetensors"), std::string::npos) << resumed.output;
  EXPECT_EQ(fs::file_size(model), damaged_size);
  EXPECT_FALSE(fs::exists(dir / "run/checkpoints/step_00000004"));
}

// Before: a resume with another optim.no_decay (other parameters decaying, the optimizer state read
// as theirs) or another train.steps went unnoticed. The first is refused naming the key; the second,
// harmless, goes on with a warning.
TEST(GPTCliTest, AResumeRefusesAnotherNoDecayAndWarnsOfAnotherLength) {
  const auto dir = temp_dir("resume_settings");
  const std::string config = tiny_run(dir, 1);
  ASSERT_EQ(run_gpt("train" + config).exit_code, 0);
  const Result refused = run_gpt("train" + config + " --set train.steps=4 --set 'optim.no_decay=[\"bias\"]'");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(testing::Contains(refused.output, "optim.no_decay")) << refused.output;
  EXPECT_FALSE(fs::exists(dir / "run/checkpoints/step_00000004"));
  const Result longer = run_gpt("train" + config + " --set train.steps=4");
  EXPECT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_TRUE(testing::Contains(longer.output, "train.steps is 4 but checkpoint")) << longer.output;
  EXPECT_TRUE(fs::exists(dir / "run/checkpoints/step_00000004"));
}

// Before: a save that died left step_N.partial behind for good, and a `latest` naming a folder that a
// dying re-save had removed stopped every resume. The next run removes the leftover, and takes the newest
// complete checkpoint in place of the gone one (with a warning).
TEST(GPTCliTest, LeftoversOfADyingSaveNeitherStayNorStopTheNextRun) {
  const auto dir = temp_dir("dying_save");
  const std::string config = tiny_run(dir, 1);
  ASSERT_EQ(run_gpt("train" + config + " --set train.checkpoint_interval=1").exit_code, 0);
  const fs::path checkpoints = dir / "run/checkpoints";
  fs::create_directories(checkpoints / "step_00000003.partial");
  std::ofstream(checkpoints / "step_00000003.partial/model.safetensors") << "half";
  write_file_atomic((checkpoints / "latest").string(), "step_00000003\n");
  const Result resumed = run_gpt("train" + config + " --set train.steps=3 --set train.checkpoint_interval=1");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(testing::Contains(resumed.output, "left by a checkpoint save that did not finish")) << resumed.output;
  EXPECT_TRUE(testing::Contains(resumed.output, "names a folder that is gone: taking the newest complete checkpoint")) << resumed.output;
  EXPECT_TRUE(testing::Contains(resumed.output, "resumed from " + (checkpoints / "step_00000002").string())) << resumed.output;
  EXPECT_TRUE(fs::exists(checkpoints / "step_00000003/manifest.json"));
}

// prepare -> train -> generate as a user runs them; generate.prompts continues several texts as one
// left-padded batch and prints each prompt with its continuation.
TEST(GPTCliTest, GenerateContinuesEachPromptOfABatch) {
  const auto dir = temp_dir("generate");
  {
    std::ofstream text(dir / "text.txt");
    const char* words[] = {"light", "darkness", "water", "earth", "heaven", "morning", "evening", "day"};
    for (int line = 0; line < 400; ++line) {
      text << "And the " << words[line % 8] << " was upon the " << words[(line * 3 + 1) % 8] << " of the "
           << words[(line * 5 + 2) % 8] << ".\n";
    }
  }
  std::ofstream(dir / "c.toml") << "[model]\nn_positions = 32\nn_embd = 16\nn_layer = 1\nn_head = 2\n"
                                << "[data]\ncontext = 8\nvocab_size = 300\nval_every = 2\ntext = \"" << (dir / "text.txt").string()
                                << "\"\ndir = \"" << (dir / "data").string() << "\"\n"
                                << "[train]\nsteps = 2\nbatch_size = 2\nmicro_batch_size = 2\neval_rows = 2\n"
                                << "out_dir = \"" << (dir / "run").string() << "\"\n[runtime]\nthreads = 1\n"
                                << "[generate]\nmax_new_tokens = 5\nprompts = [\"And the light\", \"water\"]\n";
  const std::string config = " --config " + (dir / "c.toml").string();
  for (const char* command : {"prepare", "train"}) {
    const Result result = run_gpt(command + config);
    ASSERT_EQ(result.exit_code, 0) << command << ": " << result.output;
  }
  const Result batch = run_gpt("generate" + config);
  ASSERT_EQ(batch.exit_code, 0) << batch.output;
  const size_t first = batch.output.find("And the light"), second = batch.output.find("\nwater");
  EXPECT_NE(first, std::string::npos) << batch.output;
  EXPECT_NE(second, std::string::npos) << batch.output;
  EXPECT_LT(first, second) << batch.output;
  // --prompt replaces the list with one text.
  const Result one = run_gpt("generate" + config + " --prompt \"morning\"");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(one.output.rfind("morning", 0), 0u) << one.output;
  EXPECT_EQ(one.output.find("water"), std::string::npos) << one.output;
}

// export writes a checkpoint as a Hugging Face folder; a run with model.init_from = that folder starts
// from its weights (one step at learning rate 0 keeps them: its checkpoint equals the first run's).
// The folder's config gives the shape: a model.* shape key that contradicts it is refused, and an export
// never replaces a folder.
TEST(GPTCliTest, ExportedFolderStartsAnotherRun) {
  const auto dir = temp_dir("export");
  const std::string config = tiny_run(dir, 2);
  const Result trained = run_gpt("train" + config);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const Result exported = run_gpt("export" + config + " --out " + (dir / "hf").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  ASSERT_TRUE(fs::exists(dir / "hf/model.safetensors")) << exported.output;

  std::ofstream(dir / "init.toml") << "[model]\ninit_from = \"" << (dir / "hf").string() << "\"\n"
                                   << "[data]\ncontext = 8\ndir = \"" << dir.string() << "\"\n"
                                   << "[train]\nsteps = 1\nbatch_size = 2\nmicro_batch_size = 2\neval_rows = 2\n"
                                   << "out_dir = \"" << (dir / "run2").string() << "\"\n[optim]\nlr = 0.0\nmin_lr = 0.0\n"
                                   << "[runtime]\nthreads = 1\n";
  const Result started = run_gpt("train --config " + (dir / "init.toml").string());
  ASSERT_EQ(started.exit_code, 0) << started.output;
  const auto first = io::load_safetensors((dir / "run/checkpoints/step_00000002/model.safetensors").string());
  const auto second = io::load_safetensors((dir / "run2/checkpoints/step_00000001/model.safetensors").string());
  ASSERT_EQ(first.tensors.size(), second.tensors.size());
  for (const auto& [name, tensor] : first.tensors) {
    ASSERT_NE(second.find(name), nullptr) << name;
    EXPECT_TRUE(torch::equal(tensor, *second.find(name))) << name;
  }

  // Shape keys may repeat the folder's values, not contradict them.
  const Result agreeing = run_gpt("eval --config " + (dir / "init.toml").string() + " --set model.n_layer=2");
  EXPECT_EQ(agreeing.exit_code, 0) << agreeing.output;
  const Result shaped = run_gpt("train --config " + (dir / "init.toml").string() + " --set model.n_layer=3");
  EXPECT_NE(shaped.exit_code, 0);
  EXPECT_NE(shaped.output.find("model.n_layer"), std::string::npos) << shaped.output;
  EXPECT_NE(shaped.output.find("config.json has 2"), std::string::npos) << shaped.output;
  const Result again = run_gpt("export" + config + " --out " + (dir / "hf").string());
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("already exists"), std::string::npos) << again.output;
}

// `eval` scores what training's evaluations scored: the moving average where optim.ema_decay keeps one
// (the same weights and rows: the same loss to float32's last digits), and the raw weights without it.
TEST(GPTCliTest, EvalScoresTheMovingAverageTrainingScored) {
  const auto dir = temp_dir("eval_ema");
  const std::string config = tiny_run(dir, 2) + " --set optim.ema_decay=0.5 --set train.eval_interval=2 --set optim.lr=0.05 --set optim.warmup_steps=0";
  const Result trained = run_gpt("train" + config);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const nlohmann::json last_eval = testing::last_line_with(dir / "run/metrics.jsonl", "val_loss");
  ASSERT_TRUE(last_eval.contains("val_loss")) << "no evaluation in metrics.jsonl";
  const Result averaged = run_gpt("eval" + config);
  ASSERT_EQ(averaged.exit_code, 0) << averaged.output;
  const double trained_loss = last_eval["val_loss"].get<double>();
  EXPECT_NEAR(testing::last_json_line(averaged.output)["val_loss"].get<double>(), trained_loss, 1e-6 * trained_loss) << averaged.output;
  const Result raw = run_gpt("eval" + config + " --set optim.ema_decay=0");
  ASSERT_EQ(raw.exit_code, 0) << raw.output;
  EXPECT_GT(std::abs(testing::last_json_line(raw.output)["val_loss"].get<double>() - trained_loss), 1e-4) << raw.output;
}

// The benchmark steps the model as the trainer does, memory strategy and activation checkpointing
// included, and prints the line every app prints. On runtime.device = "auto": a fresh process on a GPU
// machine reads the GPU's memory meter before anything else touches CUDA.
// A two-layer model's benchmark config in `dir` (c.toml).
void write_benchmark_config(const fs::path& dir) {
  std::ofstream(dir / "c.toml") << "[model]\nvocab_size = 64\nn_positions = 16\nn_embd = 16\nn_layer = 2\nn_head = 2\n"
                                << "[data]\ncontext = 8\ndir = \"" << dir.string() << "\"\n"
                                << "[train]\nmicro_batch_size = 2\n[runtime]\nthreads = 1\n"
                                << "[benchmark]\nsteps = 2\nwarmup = 1\n";
}

TEST(GPTCliTest, BenchmarkRunsTheConfiguredStrategiesAndPrintsTheSharedLine) {
  const auto dir = temp_dir("benchmark");
  write_benchmark_config(dir);
  const Result result = run_gpt("benchmark --config " + (dir / "c.toml").string() +
                                " --set memory.strategy='\"gemini\"' --set precision.dtype='\"bf16\"'"
                                " --set memory.activation_checkpointing=true");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json line = testing::last_json_line(result.output);
  testing::expect_benchmark_line(line, "gpt", "tokens", 8);
  EXPECT_EQ(line.value("memory_strategy", ""), "gemini");
  EXPECT_EQ(line.value("activation_checkpointing", false), true);
  EXPECT_GT(line.value("chunks_mb", 0.0), 0) << "Gemini's figures";
  EXPECT_EQ(line.value("context", 0), 8);
  // The attention kernels the steps ran: bf16 on the CPU at 8 keys takes Kuafu's products under "auto".
  EXPECT_EQ(line.value("attention_backend", ""), "auto");
  EXPECT_EQ(line["attention_kernels"], nlohmann::json::array({"products"})) << line.dump();
  // A kernel the CPU does not have stops the run, naming the key.
  const Result cudnn = run_gpt("benchmark --config " + (dir / "c.toml").string() + " --set runtime.attention_backend='\"cudnn\"'");
  EXPECT_NE(cudnn.exit_code, 0);
  EXPECT_NE(cudnn.output.find("runtime.attention_backend = \"cudnn\""), std::string::npos) << cudnn.output;
  EXPECT_EQ(line.value("cuda_graphs", true), false);
  // The step as a CUDA graph captures it needs a CUDA device: refused on the CPU, naming the key.
  const Result graphs = run_gpt("benchmark --config " + (dir / "c.toml").string() + " --set benchmark.cuda_graphs=true");
  EXPECT_NE(graphs.exit_code, 0);
  EXPECT_NE(graphs.output.find("benchmark.cuda_graphs"), std::string::npos) << graphs.output;
  EXPECT_NE(graphs.output.find("CUDA device"), std::string::npos) << graphs.output;
  // A model cut over ranks is not what the benchmark builds: refused, naming the key.
  const Result tensor = run_gpt("benchmark --config " + (dir / "c.toml").string() + " --set parallel.tensor.mode='\"1d\"'");
  EXPECT_NE(tensor.exit_code, 0);
  EXPECT_NE(tensor.output.find("parallel.tensor.mode"), std::string::npos) << tensor.output;
  EXPECT_NE(tensor.output.find("times the whole model on every rank"), std::string::npos) << tensor.output;
  const Result pipeline = run_gpt("benchmark --config " + (dir / "c.toml").string() + " --set parallel.pipeline=2");
  EXPECT_NE(pipeline.exit_code, 0);
  EXPECT_NE(pipeline.output.find("parallel.pipeline"), std::string::npos) << pipeline.output;
}

// runtime.mkl_kernels reaches MKL before its first call, in a fresh process (float32 products through
// runtime.cpu_blas = "libtorch" are MKL's): the line names what MKL was told when it picked its kernels.
TEST(GPTCliTest, TheBenchmarksMklTakesTheConfiguredKernels) {
  const auto dir = temp_dir("benchmark_mkl");
  write_benchmark_config(dir);
  for (const std::string kernels : {"instruction_set", "vendor"}) {
    const Result result = run_gpt("benchmark --config " + (dir / "c.toml").string() +
                                  " --set runtime.cpu_blas='\"libtorch\"' --set runtime.mkl_kernels='\"" + kernels + "\"'");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_EQ(testing::last_json_line(result.output).value("mkl_kernels", ""), kernels) << result.output;
  }
  const Result wrong = run_gpt("benchmark --config " + (dir / "c.toml").string() + " --set runtime.mkl_kernels='\"intel\"'");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("runtime.mkl_kernels"), std::string::npos) << wrong.output;
}

// An executable started without OMP_WAIT_POLICY restarts itself passive with a spin of about 0.1 ms
// first (openmp_env.h), and libgomp's variables the user set are kept: the benchmark line reports what the
// process ran with.
TEST(GPTCliTest, TheAppsWaitPassivelyAfterAShortSpinUnlessTheUserChose) {
  const auto dir = temp_dir("benchmark_openmp");
  write_benchmark_config(dir);
  const std::string benchmark = std::string(KUAFU_GPT_PATH) + " benchmark --config " + (dir / "c.toml").string();
  const struct {
    std::string environment, policy, spin;
  } cases[] = {{"env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT", "passive", kOpenMpSpinCount},
               {"env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=0", "passive", "0"},
               {"env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active", "active", ""}};
  for (const auto& c : cases) {
    const Result result = testing::run_command(c.environment + " " + benchmark);
    ASSERT_EQ(result.exit_code, 0) << c.environment << "\n" << result.output;
    const nlohmann::json line = testing::last_json_line(result.output);
    EXPECT_EQ(line.value("omp_wait_policy", "?"), c.policy) << c.environment;
    EXPECT_EQ(line.value("gomp_spincount", "?"), c.spin) << c.environment;
  }
}

}  // namespace
}  // namespace kuafu::gpt

// End-to-end GPT training through the Trainer on a small synthetic corpus: loss goes down, gradient
// accumulation equals the large batch, data parallelism on 2 Gloo ranks equals 1 rank, a resumed
// run follows the uninterrupted loss curve exactly, and stop / divergence keep the last checkpoint.
#include <gtest/gtest.h>

#include <chrono>

#include <filesystem>
#include <fstream>
#include <set>

#include "apps/gpt/commands.h"
#include "core/dist/launch_env.h"
#include "core/io/token_file.h"
#include "core/dist/collectives.h"
#include "core/io/safetensors.h"
#include "core/util/error.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_util.h"
#include "tests/apps/gpt/gpt_training_support.h"
#include "tests/support/devices.h"

namespace kuafu::gpt {
namespace {

TEST_F(GPTTrainingTest, LossGoesDownAndMetricsAreWritten) {
  const auto config = make_config(root_, "run", "train.steps=30\noptim.lr=1e-2");
  train_serially(config);
  const auto losses = losses_of(root_ / "run" / "metrics.jsonl");
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), losses.front() - 1.0) << "first " << losses.front() << " last " << losses.back();
  // MFU is relative to the measured matrix-product rate, which the step can never beat.
  for (const auto& line : metric_lines(root_ / "run" / "metrics.jsonl")) {
    EXPECT_GT(line.at("mfu").get<double>(), 0.0) << line.dump();
    EXPECT_LE(line.at("mfu").get<double>(), 1.0) << line.dump();
  }
  EXPECT_TRUE(fs::exists(train::checkpoint_folder((root_ / "run" / "checkpoints").string(), 30)));
}

// Tolerances 2e-5 (weights) and 1e-5 (relative, gradient norms): the two runs differ only in float32
// summation order (4 micro-batches of 2 rows vs 8 rows).
TEST_F(GPTTrainingTest, GradientAccumulationEqualsLargeBatch) {
  const auto large = train_serially(make_config(root_, "large", kPlainSgd));
  const auto accumulated = train_serially(make_config(root_, "accumulated", kPlainSgd + "train.micro_batch_size=2"));
  EXPECT_LT(max_difference(large, accumulated), 2e-5);
  EXPECT_LT(grad_norm_difference(root_ / "accumulated", root_ / "large"), 1e-5);
}

// The comparison above can fail: accumulating 4 micro-steps without their 1/4 (each micro-step's loss x 4
// is the same gradients as dropping the factor) moves the weights far beyond its tolerances.
TEST_F(GPTTrainingTest, DroppingTheAccumulationFactorFailsTheComparison) {
  const auto large = train_serially(make_config(root_, "large", kPlainSgd));
  const auto config = make_config(root_, "dropped", kPlainSgd + "train.micro_batch_size=2");
  auto runtime = single_runtime();
  InjectedTask dropped(make_text_task(config), {0, 1, 2, 3, 4, 5}, 4.0);
  train::Trainer(config, runtime, dropped).run();
  EXPECT_GT(max_difference(large, dropped.model().parameters()), 100 * 2e-5);
  EXPECT_NEAR(metric_lines(root_ / "dropped" / "metrics.jsonl").front().at("grad_norm").get<double>(),
              4 * metric_lines(root_ / "large" / "metrics.jsonl").front().at("grad_norm").get<double>(), 1e-4);
}

// With dropout, so that the restored random streams matter: the CPU's, and on a GPU that GPU's.
TEST_F(GPTTrainingTest, ResumeFollowsTheUninterruptedLossCurveExactly) {
  for (const torch::Device& device : testing::devices_to_test()) {
    SCOPED_TRACE(device.str());
    const std::string on = "model.dropout=0.1\nruntime.device=\"" + device.str() + "\"";
    const std::string tag = device.is_cpu() ? "" : "_gpu";
    auto train = [&](const std::string& name, const std::string& extra) {
      const config::Config config = make_config(root_, name + tag, extra + on);
      train::Runtime runtime = train::start_runtime(config);
      std::unique_ptr<TextTask> task = make_text_task(config, runtime);
      train::Trainer(config, runtime, *task).run();
    };
    train("straight", "");
    train("resumed", "train.steps=3\n");
    train("resumed", "");  // picks up the step-3 checkpoint
    const auto straight = losses_of(root_ / ("straight" + tag) / "metrics.jsonl");
    const auto resumed = losses_of(root_ / ("resumed" + tag) / "metrics.jsonl");
    ASSERT_EQ(straight.size(), 6u);
    ASSERT_EQ(resumed.size(), 6u);
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
  }
}

// train.async_save: each checkpoint is written by a background thread from a copy in host memory while
// the steps go on, and sealed at the first step every rank has finished its part. On 2 ranks under
// ZeRO-2 (each rank writes its own pieces), dropout on: every checkpoint's tensor and RNG files are the
// synchronous run's byte for byte, the losses are the same, and a run resumed from the asynchronous
// checkpoint of step 4 continues the loss curve exactly.
TEST_F(GPTTrainingTest, AsyncSaveWritesTheSameCheckpointsAndResumesExactly) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 180);
  const std::string common = "model.dropout=0.1\ntrain.micro_batch_size=4\ntrain.checkpoint_interval=2\n"
                             "train.keep_checkpoints=5\nmemory.strategy=\"zero2\"\ndist.timeout_s=30\n";
  train::Runtime runtime = train::start_runtime(make_config(root_, "sync", common));
  auto train = [&](const std::string& name, const std::string& extra) {
    const auto config = make_config(root_, name, common + extra);
    auto task = make_text_task(config, runtime);
    train::Trainer(config, runtime, *task).run();
  };
  train("sync", "");
  train("async", "train.async_save=true");
  train("resumed", "train.async_save=true\ntrain.resume=\"" +
                       train::checkpoint_folder((root_ / "async" / "checkpoints").string(), 4) + "\"");
  if (!runtime.is_main()) return;
  const auto bytes = [](const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const int64_t step : {2, 4, 6}) {
    const fs::path sync = train::checkpoint_folder((root_ / "sync" / "checkpoints").string(), step);
    const fs::path async = train::checkpoint_folder((root_ / "async" / "checkpoints").string(), step);
    int compared = 0;
    for (const auto& entry : fs::directory_iterator(sync)) {
      if (entry.path().extension() != ".safetensors") continue;
      EXPECT_EQ(bytes(async / entry.path().filename()), bytes(entry.path())) << entry.path().filename() << " step " << step;
      ++compared;
    }
    EXPECT_GE(compared, 6) << "model and optimizer pieces and RNG states of 2 ranks at step " << step;
    EXPECT_TRUE(fs::exists(async / "manifest.json")) << step;
  }
  const auto straight = losses_of(root_ / "sync" / "metrics.jsonl");
  ASSERT_EQ(straight.size(), 6u);
  EXPECT_EQ(losses_of(root_ / "async" / "metrics.jsonl"), straight);
  EXPECT_EQ(losses_of(root_ / "resumed" / "metrics.jsonl"), std::vector<double>(straight.begin() + 4, straight.end()));
}

TEST_F(GPTTrainingTest, ResumeRefusesACheckpointOfAnotherModel) {
  train_serially(make_config(root_, "run", "train.steps=2"));
  try {
    train_serially(make_config(root_, "run", "model.n_embd=64"));
    FAIL() << "a checkpoint of another model shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_embd"), std::string::npos) << e.what();
  }
}

// A stop request during step 2's first micro-step: before, the step's remaining micro-steps ran and
// step 2 was saved; now they are dropped, step 1's weights are saved, and a resume redoes step 2.
TEST_F(GPTTrainingTest, AStopInterruptsTheMicroStepsAndResumesFromTheLastWholeStep) {
  const auto config = make_config(root_, "run", "train.steps=3\ntrain.micro_batch_size=2");
  auto runtime = single_runtime();
  struct StopDuringStep2 : InjectedTask {
    using InjectedTask::InjectedTask;
    torch::Tensor loss(int64_t step, int64_t first, int64_t rows) override {
      ++calls;
      if (step == 1) train::request_stop();  // as if SIGTERM arrived now
      return InjectedTask::loss(step, first, rows);
    }
    int calls = 0;
  } task(make_text_task(config), {}, 1.0);
  const int64_t accumulation = config.get_int("train.batch_size") / config.get_int("train.micro_batch_size");
  ASSERT_GT(accumulation, 1);
  {
    train::Trainer trainer(config, runtime, task);
    const train::TrainSummary summary = trainer.run();
    train::clear_stop_request();
    EXPECT_TRUE(summary.stopped_by_signal);
    EXPECT_EQ(summary.steps_done, 1);
  }
  EXPECT_EQ(task.calls, accumulation + 1) << "step 2 stops after its first micro-step";
  const std::string root = (root_ / "run" / "checkpoints").string();
  EXPECT_EQ(train::CheckpointStore::read_trainer_state(train::checkpoint_folder(root, 1)).at("step"), 1);
  EXPECT_FALSE(fs::exists(train::checkpoint_folder(root, 2)));
  // Resuming redoes step 2 and the rest.
  train_serially(config);
  EXPECT_EQ(train::CheckpointStore::read_trainer_state(train::checkpoint_folder(root, 3)).at("step"), 3);
}

// Before: the MFU probe drew its matrices from the default generator after a resume had restored it,
// so with dropout the resumed run's masks differed from the uninterrupted run's.
TEST_F(GPTTrainingTest, TheMatrixProductProbeDrawsNoRandomNumbers) {
  torch::manual_seed(7);
  const torch::Tensor expected = torch::rand({4});
  torch::manual_seed(7);
  train::measure_matmul_flops(torch::kCPU, torch::kFloat32, /*fresh=*/true);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

// Before: model.n_layer = 1e9 grew memory at ~300 MB/s until the OOM killer, with no output, and
// train.batch_size = 1e12 was accepted.
TEST_F(GPTTrainingTest, AModelThatCannotFitIsRefusedBeforeItIsBuilt) {
  using testing::Contains;
  const std::string absurd = testing::error_message([&] { make_config(root_, "run", "model.n_layer=1000000000"); });
  EXPECT_TRUE(Contains(absurd, "model.n_layer")) << absurd;
  const std::string batch = testing::error_message([&] { make_config(root_, "run", "train.batch_size=1000000000000"); });
  EXPECT_TRUE(Contains(batch, "train.batch_size")) << batch;
  // Within the bounds but beyond this machine: 100,000 layers of width 4096 is 2e13 parameters.
  const auto config = make_config(root_, "run", "model.n_layer=100000\nmodel.n_embd=4096\nmodel.n_head=32");
  auto runtime = single_runtime();
  const auto start = std::chrono::steady_clock::now();
  const std::string message = testing::error_message([&] { train::check_model_fits(make_gpt_app(config)->model_size(), config, runtime); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_TRUE(Contains(message, "model.n_layer = 100000, model.n_embd = 4096")) << message;
  EXPECT_TRUE(Contains(message, "GiB")) << message;
  // The tiny model of these tests fits.
  const config::Config run = make_config(root_, "run", "");
  EXPECT_NO_THROW(train::check_model_fits(make_gpt_app(run)->model_size(), run, runtime));
}

// Before: generate.top_p = 0 passed the config check and failed during sampling.
TEST_F(GPTTrainingTest, SamplingSettingsThatCannotSampleAreRefusedWithTheConfig) {
  const std::string message = testing::error_message([&] { make_config(root_, "run", "generate.top_p=0"); });
  EXPECT_TRUE(testing::Contains(message, "generate.top_p")) << message;
}

// Before: a data.dir under a file gave the raw "filesystem error: cannot create directories".
TEST_F(GPTTrainingTest, PrepareNamesADataFolderThatCannotBeCreated) {
  const fs::path file = root_ / "a_file";
  std::ofstream(file) << "x";
  const std::string text = (root_ / "text.txt").string();
  std::ofstream(text) << "In the beginning\n";
  const auto config = make_config(root_, "run", "data.dir=\"" + (file / "sub").string() + "\"\ndata.text=\"" + text + "\"");
  const std::string message = testing::error_message([&] { prepare_command(config); });
  EXPECT_TRUE(testing::Contains(message, "data.dir")) << message;
  EXPECT_TRUE(testing::Contains(message, "cannot create the folder")) << message;
}

// A task whose loss turns NaN at step 3: the trainer must stop with an error and leave step 2's checkpoint.
TEST_F(GPTTrainingTest, NonFiniteLossStopsAndKeepsLastGoodCheckpoint) {
  const auto config = make_config(root_, "run", "train.checkpoint_interval=1");
  auto runtime = single_runtime();
  InjectedTask task(make_text_task(config), {2}, std::numeric_limits<double>::quiet_NaN());
  train::Trainer trainer(config, runtime, task);
  try {
    trainer.run();
    FAIL() << "a NaN loss did not stop training";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step_00000002"), std::string::npos) << e.what();
  }
  const auto root = (root_ / "run" / "checkpoints").string();
  EXPECT_EQ(*train::CheckpointStore(root, runtime.world->world_group(), 3).latest(), train::checkpoint_folder(root, 2));
  EXPECT_FALSE(fs::exists(train::checkpoint_folder(root, 3)));
}

// Same global batch of 8 rows: 2 ranks x 4 rows against 1 rank x 8 rows, 6 plain SGD steps.
// Tolerances 2e-5 (weights) and 1e-5 (relative, gradient norms): only float32 summation order differs
// (per-rank means averaged vs one mean).
TEST_F(GPTTrainingTest, TwoDataParallelRanksEqualOneRank) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  const auto config = make_config(root_, "parallel", kPlainSgd + "train.micro_batch_size=4\ndist.timeout_s=30");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config);
  train::Trainer trainer(config, runtime, *task);
  trainer.run();
  const std::string serial_name = "serial_rank" + std::to_string(runtime.world->rank());
  const auto serial = train_serially(make_config(root_, serial_name, kPlainSgd));
  EXPECT_LT(max_difference(task->model().parameters(), serial), 2e-5);
  if (runtime.is_main()) {
    EXPECT_LT(grad_norm_difference(root_ / "parallel", root_ / serial_name), 1e-5);
  }
}

// The full weights of a (possibly tensor-parallel) model: blocks gathered over the tensor group.
std::vector<torch::Tensor> full_weights(GPT& model) {
  std::vector<torch::Tensor> out;
  const auto layouts = parallel::collect_layouts(*model);
  for (const auto& item : model->named_parameters()) {
    const auto found = layouts.find(item.key());
    out.push_back(found == layouts.end() ? item.value().detach()
                                         : parallel::gather_full(item.value().detach(), found->second, *model->tp.mesh));
  }
  return out;
}

// Tensor parallelism through the trainer, from the config alone, against the serial run of the same
// global batch (6 plain SGD steps): `tensor` holds the parallel.tensor overrides, and `micro_batch` rows
// per data rank leave the other ranks to data parallelism. Tolerances 2e-5 (weights) and 1e-5 (relative,
// gradient norms): float32, only summation order differs.
void tensor_parallel_training_equals_serial(const fs::path& root, const std::string& name, const std::string& tensor,
                                            int micro_batch, const std::string& optimizer = kPlainSgd) {
  const auto config = make_config(root, name, optimizer + tensor + "\ntrain.micro_batch_size=" +
                                                  std::to_string(micro_batch) + "\ndist.timeout_s=30");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config, runtime);  // as a run builds it: lazily, under ZeRO and Gemini
  train::Trainer trainer(config, runtime, *task);
  trainer.run();
  // The checkpoint holds whole tensors: a serial model loads it.
  GPT reloaded(model_config(config));
  train::CheckpointStore::load_model(train::checkpoint_folder((root / name / "checkpoints").string(), 6), *reloaded);
  // Gemini keeps the weights in its chunks, released between steps: its checkpoint speaks for them.
  const bool model_holds_weights = config.get_string("memory.strategy") != "gemini";
  const auto parallel = model_holds_weights ? full_weights(task->model_holder()) : reloaded->parameters();
  const std::string serial_name = "serial_" + name + "_" + std::to_string(runtime.world->rank());
  const auto serial = train_serially(make_config(root, serial_name, optimizer));
  EXPECT_LT(max_difference(parallel, serial), 2e-5);
  if (runtime.is_main()) {
    EXPECT_LT(grad_norm_difference(root / name, root / serial_name), 1e-5);
  }
  // ... and equals the gathered weights.
  EXPECT_LT(max_difference(reloaded->parameters(), parallel), 1e-12);
  // Communication accounting: every step records the bytes this rank sent over its tensor groups (1D's
  // one group; 2D's rows and columns), beside those of the data group (made by all ranks: it is collective)
  // and the world's (the step's agreement on losses and flags).
  const std::string data_group = runtime.mesh->group("data")->name();
  if (runtime.is_main()) {
    for (const auto& line : metric_lines(root / name / "metrics.jsonl")) {
      ASSERT_TRUE(line.contains("comm_bytes_sent")) << line.dump();
      int64_t tensor_bytes = 0;
      for (const auto& [group, bytes] : line["comm_bytes_sent"].items()) {
        if (group != data_group && group != "world") tensor_bytes += bytes.get<int64_t>();
      }
      EXPECT_GT(tensor_bytes, 0) << line.dump();
    }
  }
}

const std::string k1d = "parallel.tensor.mode=\"1d\"\nparallel.tensor.size=2";
const std::string k2d = "parallel.tensor.mode=\"2d\"\nparallel.tensor.size=4";
const std::string k2p5d = "parallel.tensor.mode=\"2.5d\"\nparallel.tensor.size=8\nparallel.tensor.depth=2";
const std::string k3d = "parallel.tensor.mode=\"3d\"\nparallel.tensor.size=8";

TEST_F(GPTTrainingTest, TensorParallelOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  tensor_parallel_training_equals_serial(root_, "tp_1d", k1d, 8);
}

TEST_F(GPTTrainingTest, TensorTimesDataParallelOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 120);
  tensor_parallel_training_equals_serial(root_, "tp_1d_dp", k1d, 4);
}

// ZeRO-1/2 and Gemini shard each tensor-parallel block over the data ranks that hold it (2 data x 2
// tensor): plain SGD's weights after each step and the global gradient norms equal the serial run's, so
// the gradients do (a block replicated over the tensor group counted once in the norm).
TEST_F(GPTTrainingTest, TensorTimesDataParallelUnderZero1OnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  tensor_parallel_training_equals_serial(root_, "tp_1d_zero1", k1d + "\nmemory.strategy=\"zero1\"", 4);
}

TEST_F(GPTTrainingTest, TensorTimesDataParallelUnderZero2OnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  tensor_parallel_training_equals_serial(root_, "tp_1d_zero2", k1d + "\nmemory.strategy=\"zero2\"", 4);
}

TEST_F(GPTTrainingTest, TensorTimesDataParallelUnderGeminiOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  tensor_parallel_training_equals_serial(root_, "tp_1d_gemini", k1d + "\nmemory.strategy=\"gemini\"", 4);
}

// LAMB and LARS scale each parameter's step by the ratio of its norm to its update's: under sharding
// with tensor parallelism those norms add the pieces over the data ranks and the blocks over the tensor
// ranks at once. Their weights after 6 steps equal the serial run's (a norm over a part of a parameter
// changes its ratio, and so every later weight, well beyond 2e-5; the gradients are checked above).
const std::string kLamb = "optim.name=\"lamb\"\noptim.lr=5e-2\noptim.eps=1e-6\noptim.grad_clip=0\n";
const std::string kLars = "optim.name=\"lars\"\noptim.lr=0.2\noptim.trust_coefficient=0.02\noptim.grad_clip=0\n";

TEST_F(GPTTrainingTest, TensorTimesDataParallelUnderZero2WithLambOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  tensor_parallel_training_equals_serial(root_, "tp_1d_zero2_lamb", k1d + "\nmemory.strategy=\"zero2\"", 4, kLamb);
}

TEST_F(GPTTrainingTest, TensorTimesDataParallelUnderGeminiWithLarsOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  tensor_parallel_training_equals_serial(root_, "tp_1d_gemini_lars", k1d + "\nmemory.strategy=\"gemini\"", 4, kLars);
}

// The same with each 2D grid block sharded over 2 data ranks (2 data x (2 x 2) = 8 ranks).
TEST_F(GPTTrainingTest, TwoDimensionalTimesDataParallelUnderZero2OnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 240);
  tensor_parallel_training_equals_serial(root_, "tp_2d_zero2", k2d + "\nmemory.strategy=\"zero2\"", 4);
}

TEST_F(GPTTrainingTest, TwoDimensionalTimesDataParallelUnderGeminiOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 240);
  tensor_parallel_training_equals_serial(root_, "tp_2d_gemini", k2d + "\nmemory.strategy=\"gemini\"", 4);
}

TEST_F(GPTTrainingTest, TwoDimensionalOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 120);
  tensor_parallel_training_equals_serial(root_, "tp_2d", k2d, 8);
}

// 2 data x (2 x 2) grid = 8 ranks.
TEST_F(GPTTrainingTest, TwoDimensionalTimesDataParallelOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 180);
  tensor_parallel_training_equals_serial(root_, "tp_2d_dp", k2d, 4);
}

TEST_F(GPTTrainingTest, TwoAndAHalfDimensionalOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 180);
  tensor_parallel_training_equals_serial(root_, "tp_2p5d", k2p5d, 8);
}

TEST_F(GPTTrainingTest, ThreeDimensionalOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 180);
  tensor_parallel_training_equals_serial(root_, "tp_3d", k3d, 8);
}

// Sequence parallelism through the trainer, from the config alone, against the serial run of the same
// global batch (6 plain SGD steps): each rank trains on one chunk of the positions of its data rank's rows,
// gradients averaged over data x sequence. Tolerances 2e-5 (weights) and 1e-5 (relative, gradient norms):
// float32, only summation order differs. The
// evaluation (a mean over the chunks) and the checkpoint (whole weights) match the serial ones too.
void sequence_parallel_training_equals_serial(const fs::path& root, const std::string& name, const std::string& mode,
                                              int size, int micro_batch) {
  const auto config = make_config(root, name, kPlainSgd + "parallel.sequence.mode=\"" + mode + "\"\nparallel.sequence.size=" +
                                                  std::to_string(size) + "\ntrain.micro_batch_size=" +
                                                  std::to_string(micro_batch) + "\ndist.timeout_s=30");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config, runtime);
  train::Trainer trainer(config, runtime, *task);
  trainer.run();
  const train::LossSum eval = trainer.evaluate();

  const std::string serial_name = "serial_" + name + "_" + std::to_string(runtime.world->rank());
  const auto serial_config = make_config(root, serial_name, kPlainSgd);
  auto serial_runtime = single_runtime();
  auto serial_task = make_text_task(serial_config);
  train::Trainer serial_trainer(serial_config, serial_runtime, *serial_task);
  serial_trainer.run();
  const train::LossSum serial_eval = serial_trainer.evaluate();
  EXPECT_LT(max_difference(task->model().parameters(), serial_task->model().parameters()), 2e-5);
  if (runtime.is_main()) {
    EXPECT_LT(grad_norm_difference(root / name, root / serial_name), 1e-5);
  }
  EXPECT_NEAR(eval.loss_sum / eval.count, serial_eval.loss_sum / serial_eval.count, 2e-5);
  GPT reloaded(model_config(config));
  train::CheckpointStore::load_model(train::checkpoint_folder((root / name / "checkpoints").string(), 6), *reloaded);
  EXPECT_LT(max_difference(reloaded->parameters(), task->model().parameters()), 1e-12);
  // Attention's exchanges are counted on the sequence group every step.
  if (runtime.is_main()) {
    for (const auto& line : metric_lines(root / name / "metrics.jsonl")) {
      EXPECT_GT(line["comm_bytes_sent"].value(runtime.sequence.group->name(), int64_t{0}), 0) << line.dump();
    }
  }
}

TEST_F(GPTTrainingTest, RingSequenceTimesDataParallelOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 120);
  sequence_parallel_training_equals_serial(root_, "sp_ring_dp", "ring", 2, 4);
}

TEST_F(GPTTrainingTest, AllToAllSequenceParallelOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  sequence_parallel_training_equals_serial(root_, "sp_a2a", "all_to_all", 2, 8);
}

// What sequence parallelism cannot do is refused at the key, before any work.
TEST_F(GPTTrainingTest, SequenceParallelRefusesWhatItCannotCut) {
  train::Runtime runtime = single_runtime();
  runtime.sequence.mode = parallel::sequence::SequenceMode::kAllToAll;
  runtime.sequence.size = 4;  // no group is needed to refuse
  auto refusal = [&](const std::string& overrides) {
    return testing::error_message([&] { make_text_task(make_config(root_, "unused", overrides), runtime); });
  };
  EXPECT_TRUE(testing::Contains(refusal("data.context=18"), "data.context"));
  EXPECT_TRUE(testing::Contains(refusal(""), "model.n_head"));  // 2 heads among 4 ranks
  runtime.sequence.mode = parallel::sequence::SequenceMode::kRing;
  EXPECT_TRUE(testing::Contains(refusal("model.dropout=0.1"), "model.dropout"));
  const std::string combined = testing::error_message([&] {
    train::start_runtime(make_config(root_, "unused", "parallel.sequence.mode=\"ring\"\nparallel.sequence.size=2\n"
                                                      "parallel.tensor.mode=\"1d\"\nparallel.tensor.size=2"),
                         dist::World::single());
  });
  EXPECT_TRUE(testing::Contains(combined, "parallel.sequence.mode")) << combined;
  EXPECT_TRUE(testing::Contains(combined, "data parallelism only")) << combined;
}

// A batch the mode cannot cut into its row blocks is refused at the key before training.
TEST_F(GPTTrainingTest, BatchesTheGridCannotCutNameTheKey) {
  parallel::TensorParallel tp;
  tp.spec = {parallel::TensorMode::k3D, 8, 1};  // q^2 = 4 row blocks; no mesh is needed to refuse
  const std::string message = testing::error_message([&] {
    make_text_task(make_config(root_, "unused", "train.micro_batch_size=6"), tp);
  });
  EXPECT_TRUE(testing::Contains(message, "train.micro_batch_size"));
  EXPECT_TRUE(testing::Contains(message, "4 row blocks"));
}

// A checkpoint written under one tensor-parallel layout resumes under another: 3 steps as 2 data x
// 1D over 2 ranks, then 3 steps on a 2 x 2 grid (2D) from its checkpoint, weights and optimizer
// state re-cut, equal 6 serial steps. Both layouts share the 4 processes' world.
TEST_F(GPTTrainingTest, CheckpointMovesBetweenTensorParallelLayouts) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  const auto first = make_config(root_, "layout_1d", k1d + "\ntrain.micro_batch_size=4\ntrain.steps=3\ndist.timeout_s=30");
  train::Runtime runtime = train::start_runtime(first);
  {
    auto task = make_text_task(first, runtime.model_options());
    train::Trainer trainer(first, runtime, *task);
    trainer.run();
  }
  const auto second = make_config(
      root_, "layout_2d",
      k2d + "\ntrain.micro_batch_size=8\ndist.timeout_s=30\ntrain.resume=\"" +
          train::checkpoint_folder((root_ / "layout_1d" / "checkpoints").string(), 3) + "\"");
  train::Runtime grid = train::start_runtime(second, runtime.world);
  auto task = make_text_task(second, grid.model_options());
  train::Trainer trainer(second, grid, *task);
  EXPECT_EQ(trainer.start_step(), 3);
  trainer.run();
  const auto serial = train_serially(make_config(root_, "layout_serial_" + std::to_string(grid.world->rank()), ""));
  EXPECT_LT(max_difference(full_weights(task->model_holder()), serial), 2e-5);
}

// A sharded checkpoint under tensor parallelism resumes under another strategy: 3 AdamW steps under
// ZeRO-2 x 1D (2 data x 2 tensor), then 3 under Gemini x 1D from its checkpoint (each rank's block
// re-cut into its Gemini pieces, the moments with it); the checkpoint of step 6 equals 6 serial steps.
TEST_F(GPTTrainingTest, ShardedCheckpointUnderTensorParallelismResumesUnderGemini) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  const auto first = make_config(root_, "zero2_1d", k1d + "\nmemory.strategy=\"zero2\"\ntrain.micro_batch_size=4\n"
                                                          "train.steps=3\ndist.timeout_s=30");
  train::Runtime runtime = train::start_runtime(first);
  {
    auto task = make_text_task(first, runtime.model_options());
    train::Trainer trainer(first, runtime, *task);
    trainer.run();
  }
  const auto second = make_config(
      root_, "gemini_1d",
      k1d + "\nmemory.strategy=\"gemini\"\ntrain.micro_batch_size=4\ndist.timeout_s=30\ntrain.resume=\"" +
          train::checkpoint_folder((root_ / "zero2_1d" / "checkpoints").string(), 3) + "\"");
  {
    auto task = make_text_task(second, runtime.model_options());
    train::Trainer trainer(second, runtime, *task);
    EXPECT_EQ(trainer.start_step(), 3);
    trainer.run();
  }
  GPT resumed(model_config(second));
  train::CheckpointStore::load_model(train::checkpoint_folder((root_ / "gemini_1d" / "checkpoints").string(), 6), *resumed);
  const auto serial = train_serially(make_config(root_, "sharded_serial_" + std::to_string(runtime.world->rank()), ""));
  EXPECT_LT(max_difference(resumed->parameters(), serial), 2e-5);
}

// Pipeline parallelism through the trainer, from the config alone, against the serial run (6 plain SGD
// steps, the same global batch, 4 layers): every parameter this stage holds (tensor blocks gathered)
// by name within 2e-5 and the gradient norms within 1e-5 relative (float32, summation order), the same
// validation loss, and the checkpoint -
// collected from every stage on rank 0 - loads into a serial GPT equal to the serial run.
void pipeline_training_equals_serial(const fs::path& root, const std::string& name, const std::string& layout,
                                     int micro_batch) {
  const std::string layers = kPlainSgd + "model.n_layer=4\n";
  const auto config = make_config(root, name, layers + layout + "\ntrain.micro_batch_size=" +
                                                  std::to_string(micro_batch) + "\ndist.timeout_s=30");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config, runtime);
  ASSERT_TRUE(task->pipelined());
  train::Trainer trainer(config, runtime, *task);
  trainer.run();
  const train::LossSum eval = trainer.evaluate();

  const std::string serial_name = "serial_" + name + "_" + std::to_string(runtime.world->rank());
  const auto serial_config = make_config(root, serial_name, layers);
  auto single = single_runtime();
  auto serial = make_text_task(serial_config);
  train::Trainer serial_trainer(serial_config, single, *serial);
  serial_trainer.run();
  const train::LossSum serial_eval = serial_trainer.evaluate();
  EXPECT_NEAR(eval.loss_sum / eval.count, serial_eval.loss_sum / serial_eval.count, 1e-5);
  if (runtime.is_main()) {
    EXPECT_LT(grad_norm_difference(root / name, root / serial_name), 1e-5);
  }

  const auto reference = serial->model().named_parameters();
  const auto layouts = parallel::collect_layouts(*task->model_holder());
  int compared = 0;
  // Gemini keeps the weights in its chunks, released between steps: its checkpoint speaks for them.
  const bool model_holds_weights = config.get_string("memory.strategy") != "gemini";
  for (const auto& item : task->model_holder()->named_parameters()) {
    if (!model_holds_weights) break;
    const auto found = layouts.find(item.key());
    const torch::Tensor whole = found == layouts.end()
                                    ? item.value().detach()
                                    : parallel::gather_full(item.value().detach(), found->second, *runtime.mesh);
    EXPECT_LT((whole - reference[item.key()]).abs().max().item<double>(), 2e-5) << item.key();
    ++compared;
  }
  if (model_holds_weights) {
    EXPECT_LT(compared, static_cast<int>(reference.size())) << "a stage holds part of the model";
  }
  GPT reloaded(model_config(config));
  train::CheckpointStore::load_model(train::checkpoint_folder((root / name / "checkpoints").string(), 6), *reloaded);
  for (const auto& item : reloaded->named_parameters()) {
    EXPECT_LT((item.value() - reference[item.key()]).abs().max().item<double>(), 2e-5) << item.key() << " (checkpoint)";
  }
}

// batch 8 = micro 2 x 4 micro-batches per step through 2 stages.
TEST_F(GPTTrainingTest, PipelineOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  pipeline_training_equals_serial(root_, "pp_1f1b", "parallel.pipeline=2", 2);
}

// GPipe over 4 stages, one layer each: batch 8 = 4 micro-batches of 2.
TEST_F(GPTTrainingTest, GPipeOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 120);
  pipeline_training_equals_serial(root_, "pp_gpipe4", "parallel.pipeline=4\nparallel.schedule=\"gpipe\"", 2);
}

// Stages balanced by start-up timings (rank 0's, shared) still train the serial model.
TEST_F(GPTTrainingTest, TimeBalancedPipelineOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  pipeline_training_equals_serial(root_, "pp_time", "parallel.pipeline=2\nparallel.partition=\"time\"", 2);
}

TEST_F(GPTTrainingTest, InterleavedPipelineOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  pipeline_training_equals_serial(root_, "pp_interleaved",
                                  "parallel.pipeline=2\nparallel.schedule=\"interleaved\"\nparallel.chunks=2", 2);
}

// pipeline 2 x data 2: 2 micro-batches of 2 rows per data rank and step.
TEST_F(GPTTrainingTest, PipelineTimesDataParallelOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 120);
  pipeline_training_equals_serial(root_, "pp_dp", "parallel.pipeline=2", 2);
}

// ZeRO-1 and ZeRO-2 under pipeline 2 x data 2: each stage's parameters sharded over its data ranks, the
// gradients accumulated through the pipeline step and reduced once, the global norm over every rank with
// the weight tied across the two ends counted once.
TEST_F(GPTTrainingTest, PipelineTimesDataParallelUnderZero1OnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 120);
  pipeline_training_equals_serial(root_, "pp_dp_zero1", "parallel.pipeline=2\nmemory.strategy=\"zero1\"", 2);
}

TEST_F(GPTTrainingTest, PipelineTimesDataParallelUnderZero2OnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 120);
  pipeline_training_equals_serial(root_, "pp_dp_zero2", "parallel.pipeline=2\nmemory.strategy=\"zero2\"", 2);
}

// Gemini under pipeline 2 x data 2: each stage's chunks sharded over its data ranks, every micro-batch's
// backward reduced at its end while the schedule's other forwards run between them, the tied embedding's
// gradient summed over the two ends from its pieces.
TEST_F(GPTTrainingTest, PipelineTimesDataParallelUnderGeminiOnFourRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4, 180);
  pipeline_training_equals_serial(root_, "pp_dp_gemini", "parallel.pipeline=2\nmemory.strategy=\"gemini\"", 2);
}

// The interleaved schedule under Gemini: a backward pass reaches only one of the rank's two model chunks,
// so the chunks holding tensors of both are reduced at the pass's end with zeros for the others.
TEST_F(GPTTrainingTest, InterleavedPipelineUnderGeminiOnTwoRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 180);
  pipeline_training_equals_serial(root_, "pp_interleaved_gemini",
                                  "parallel.pipeline=2\nparallel.schedule=\"interleaved\"\nparallel.chunks=2\n"
                                  "memory.strategy=\"gemini\"",
                                  2);
}

// pipeline 2 x data 2 x tensor (1D) 2 = 8 ranks.
TEST_F(GPTTrainingTest, PipelineTimesDataTimesTensorParallelOnEightRanksEqualsSerial) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(8, 180);
  pipeline_training_equals_serial(root_, "pp_dp_tp", "parallel.pipeline=2\n" + k1d, 2);
}

// A serial checkpoint resumes under 1D tensor parallelism (each rank takes its blocks of the weights
// and of the optimizer state) and continues the serial run: 3 serial + 3 parallel steps = 6 serial.
TEST_F(GPTTrainingTest, SerialCheckpointResumesTensorParallel) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  const int rank = dist::detect_launch_env().rank;
  const std::string mine = "switch_" + std::to_string(rank);
  train_serially(make_config(root_, mine, "train.steps=3"));
  const auto config = make_config(root_, "unused", "parallel.tensor.mode=\"1d\"\nparallel.tensor.size=2\n"
                                                   "dist.timeout_s=30\ntrain.resume=\"" +
                                                       train::checkpoint_folder((root_ / mine / "checkpoints").string(), 3) +
                                                       "\"\ntrain.out_dir=\"" + (root_ / "tp_resumed").string() + "\"");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config, runtime.model_options());
  train::Trainer trainer(config, runtime, *task);
  EXPECT_EQ(trainer.start_step(), 3);
  trainer.run();
  const auto serial = train_serially(make_config(root_, "straight_" + std::to_string(rank), ""));
  EXPECT_LT(max_difference(full_weights(task->model_holder()), serial), 2e-5);
}

// A serial checkpoint resumes on 2 pipeline stages (each loads its part of the weights and of the
// optimizer state) and continues the serial run: 3 serial + 3 pipelined steps = 6 serial, by name.
TEST_F(GPTTrainingTest, SerialCheckpointResumesPipelined) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  const int rank = dist::detect_launch_env().rank;
  const std::string mine = "pp_switch_" + std::to_string(rank);
  train_serially(make_config(root_, mine, "model.n_layer=4\ntrain.steps=3"));
  const auto config = make_config(
      root_, "pp_resumed",
      "model.n_layer=4\nparallel.pipeline=2\ntrain.micro_batch_size=2\ndist.timeout_s=30\ntrain.resume=\"" +
          train::checkpoint_folder((root_ / mine / "checkpoints").string(), 3) + "\"");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config, runtime);
  train::Trainer trainer(config, runtime, *task);
  EXPECT_EQ(trainer.start_step(), 3);
  trainer.run();
  auto single = single_runtime();
  const auto straight_config = make_config(root_, "pp_straight_" + std::to_string(rank), "model.n_layer=4");
  auto straight = make_text_task(straight_config);
  train::Trainer(straight_config, single, *straight).run();
  const auto reference = straight->model().named_parameters();
  for (const auto& item : task->model().named_parameters()) {
    EXPECT_LT((item.value() - reference[item.key()]).abs().max().item<double>(), 2e-5) << item.key();
  }
}

// bf16 with data parallelism: bf16 gradient buckets cross Gloo (as float32) and every rank must end
// with bitwise the same weights, and the loss must fall.
TEST_F(GPTTrainingTest, Bf16DataParallelRanksStayIdentical) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  const auto config = make_config(root_, "bf16_parallel",
                                  "train.micro_batch_size=4\ndist.timeout_s=30\nprecision.dtype=\"bf16\"\n"
                                  "train.steps=12\noptim.lr=1e-2");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config);
  train::Trainer trainer(config, runtime, *task);
  trainer.run();
  for (const auto& p : task->model().parameters()) {
    EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
    torch::Tensor rank0 = p.detach().clone();
    dist::broadcast(rank0, *runtime.world->world_group());
    EXPECT_TRUE(torch::equal(rank0, p)) << "rank " << runtime.world->rank() << " drifted";
  }
  if (runtime.is_main()) {
    const auto losses = losses_of(root_ / "bf16_parallel" / "metrics.jsonl");
    ASSERT_EQ(losses.size(), 12u);
    EXPECT_LT(losses.back(), losses.front() - 0.3);
  }
}

// bf16 on 2 pipeline stages against serial bf16 with the same 4 micro-batches per step: the stages'
// float32 main gradients (the tied embedding's two copies summed across the ends) must match. Tolerance
// 5e-4: the serial run adds the embedding's input and output gradients in bf16 inside one backward
// before widening them, the stages widen each on its own (measured: 8.8e-5 at most, in ln_f after 6
// steps); leaving out the sum of the two copies misses it by far more.
TEST_F(GPTTrainingTest, Bf16PipelineOnTwoRanksMatchesSerialBf16) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 120);
  const std::string bf16 = kPlainSgd + "precision.dtype=\"bf16\"\nmodel.n_layer=4\ntrain.micro_batch_size=2\n";
  const auto config = make_config(root_, "bf16_pipeline", bf16 + "parallel.pipeline=2\ndist.timeout_s=30");
  train::Runtime runtime = train::start_runtime(config);
  auto task = make_text_task(config, runtime);
  ASSERT_TRUE(task->pipelined());
  train::Trainer(config, runtime, *task).run();
  const std::string serial = "bf16_serial_" + std::to_string(runtime.world->rank());
  train_serially(make_config(root_, serial, bf16));
  const io::SafetensorsFile a = saved(root_, "bf16_pipeline", "model.safetensors");
  const io::SafetensorsFile b = saved(root_, serial, "model.safetensors");
  expect_same_tensors(a, b, 5e-4, 1.0, "bf16 pipeline vs serial bf16");
}

// Loss scale 1024 with growth every 2 clean steps and no hysteresis; the loss of step 3 (index 2) is
// made infinite. Expected scales per step: 1024, 1024, then x2 = 2048 at step 3, which overflows and
// backs off to 1024 for steps 4 and 5, and grows to 2048 for step 6. The skipped step changes nothing.
TEST_F(GPTTrainingTest, LossScalerSkipsOverflowedStepsAndBacksOff) {
  const auto config = make_config(root_, "run",
                                  "precision.loss_scale=\"dynamic\"\nprecision.initial_scale=1024\n"
                                  "precision.growth_interval=2\nprecision.hysteresis=1");
  auto runtime = single_runtime();
  InjectedTask task(make_text_task(config), {2}, std::numeric_limits<double>::infinity());
  train::Trainer trainer(config, runtime, task);
  const auto summary = trainer.run();
  EXPECT_EQ(summary.skipped_steps, 1);
  EXPECT_EQ(trainer.optimizer().steps_taken(), 5);
  const auto lines = metric_lines(root_ / "run" / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 6u);
  const std::vector<double> scales = {1024, 1024, 2048, 1024, 1024, 2048};
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["loss_scale"].get<double>(), scales[i]) << "step " << i + 1;
    EXPECT_EQ(lines[i]["skipped"].get<bool>(), i == 2) << "step " << i + 1;
  }
  for (const auto& p : task.model().parameters()) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  // The scaler's state is in the checkpoint and comes back on resume.
  const auto state = train::CheckpointStore::read_trainer_state(
      train::checkpoint_folder((root_ / "run" / "checkpoints").string(), 6));
  EXPECT_EQ(state.at("loss_scaler").at("scale").get<double>(), 2048);
  EXPECT_EQ(state.at("loss_scaler").at("skipped_steps").get<int64_t>(), 1);
}

// Scaling the loss by a power of two and the gradients back is exact in float32 (no overflow here),
// so a run with a static-looking dynamic scale equals the unscaled run bitwise.
TEST_F(GPTTrainingTest, LossScalingWithoutOverflowChangesNothing) {
  const auto plain = train_serially(make_config(root_, "plain", ""));
  const auto scaled = train_serially(make_config(root_, "scaled", "precision.loss_scale=\"dynamic\""));
  EXPECT_EQ(max_difference(plain, scaled), 0.0);
}

// bf16 compute with float32 masters: the model holds bf16 weights, the checkpoint the float32 masters,
// the loss falls as in float32 and a resumed run follows the uninterrupted curve exactly.
TEST_F(GPTTrainingTest, Bf16TrainsWithFloat32MastersAndResumesExactly) {
  const auto bf16 = make_config(root_, "bf16", "precision.dtype=\"bf16\"\ntrain.steps=30\noptim.lr=1e-2");
  auto runtime = single_runtime();
  auto task = make_text_task(bf16);
  train::Trainer trainer(bf16, runtime, *task);
  trainer.run();
  for (const auto& p : task->model().parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  const auto losses = losses_of(root_ / "bf16" / "metrics.jsonl");
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), losses.front() - 1.0) << "first " << losses.front() << " last " << losses.back();
  // MFU is relative to the measured matrix-product rate, which the step can never beat.
  for (const auto& line : metric_lines(root_ / "run" / "metrics.jsonl")) {
    EXPECT_GT(line.at("mfu").get<double>(), 0.0) << line.dump();
    EXPECT_LE(line.at("mfu").get<double>(), 1.0) << line.dump();
  }
  const auto saved = io::load_safetensors(
      (fs::path(train::checkpoint_folder((root_ / "bf16" / "checkpoints").string(), 30)) / "model.safetensors")
          .string());
  for (const auto& [name, tensor] : saved.tensors) EXPECT_EQ(tensor.scalar_type(), torch::kFloat32) << name;

  train_serially(make_config(root_, "bf16_resumed", "precision.dtype=\"bf16\"\ntrain.steps=3"));
  train_serially(make_config(root_, "bf16_resumed", "precision.dtype=\"bf16\""));
  train_serially(make_config(root_, "bf16_straight", "precision.dtype=\"bf16\""));
  EXPECT_EQ(losses_of(root_ / "bf16_resumed" / "metrics.jsonl"), losses_of(root_ / "bf16_straight" / "metrics.jsonl"));
}

TEST_F(GPTTrainingTest, Fp16OnTheCpuIsRefusedAtTheKey) {
  const auto config = make_config(root_, "run", "precision.dtype=\"fp16\"");
  const std::string message = testing::error_message([&] { train_serially(config); });
  EXPECT_NE(message.find("precision.dtype"), std::string::npos) << message;
  EXPECT_NE(message.find("bf16"), std::string::npos) << message;
}

// Every optimizer and schedule the config offers trains the model through the trainer (the loss
// falls in 100 steps). The rates suit this tiny model: LAMB and LARS scale each layer's step by its
// weight norm (GPT init ~0.02 per element), so they need far larger nominal rates than Adam; LARS, made
// for convolutional nets, learns slowest here, hence the modest threshold.
TEST_F(GPTTrainingTest, EachConfiguredOptimizerLowersTheLoss) {
  const std::vector<std::string> setups = {
      "optim.name=\"adam\"\noptim.schedule=\"linear\"",
      "optim.name=\"sgd\"\noptim.lr=0.5\noptim.nesterov=true\noptim.schedule=\"polynomial\"\noptim.power=2.0",
      "optim.name=\"lamb\"\noptim.lr=5e-2\noptim.eps=1e-6\noptim.schedule=\"multistep\"\noptim.milestones=[80]",
      "optim.name=\"lars\"\noptim.lr=0.2\noptim.trust_coefficient=0.02\noptim.weight_decay=0.0\n"
      "optim.schedule=\"constant\"",
  };
  for (size_t i = 0; i < setups.size(); ++i) {
    const std::string out = "opt" + std::to_string(i);
    train_serially(make_config(root_, out, "train.steps=100\n" + setups[i]));
    const auto losses = losses_of(root_ / out / "metrics.jsonl");
    ASSERT_EQ(losses.size(), 100u);
    EXPECT_LT(losses.back(), losses.front() - 0.15) << setups[i] << ": first " << losses.front() << " last "
                                                    << losses.back();
  }
}

}  // namespace
}  // namespace kuafu::gpt

// OPT fine-tuning through the trainer and the kuafu-opt command line, on a tiny instruction set with
// a byte-per-token tokenizer (tests/support/byte_tokenizer.h): the step's batches (answers learned,
// prompts and padding not); ZeRO-2 and Gemini fine-tuning, full and LoRA, on 1 and 2 Gloo ranks take
// the steps of plain fine-tuning; LoRA leaves the base untouched; and the commands a user runs:
// finetune, eval (of the starting weights too), generate, export merged and as an adapter folder,
// with bad input named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/opt_finetune/app_config.h"
#include "apps/opt_finetune/commands.h"
#include "apps/opt_finetune/hugging_face.h"
#include "apps/opt_finetune/task.h"
#include "core/io/instruction_batches.h"
#include "core/io/targets.h"
#include "core/memory/frozen_offload.h"
#include "core/nn/lora.h"
#include "core/train/checkpoint.h"
#include "tests/support/byte_tokenizer.h"
#include "tests/support/multiprocess.h"
#include "tests/support/python_reference.h"
#include "tests/support/run_command.h"
#include "tests/support/test_util.h"
#include "tests/support/training_runs.h"
#include "tests/support/worker_world.h"

namespace kuafu::opt {
namespace {
namespace fs = std::filesystem;

// The config's model as an evaluation makes it (whole, float32, adapters added), which these tests know to be an OPT.
OPTForCausalLM build_opt(const config::Config& config, const parallel::ModelOptions& options) {
  const nn::CausalLMPtr model =
      train::build(causal_lm_recipe(config, read_settings(config)), config, {train::Purpose::evaluate, options}).model;
  return OPTForCausalLM(std::dynamic_pointer_cast<OPTForCausalLMImpl>(model));
}

// "What does wN mean?" -> a definition whose length varies with N, so rows pad differently.
void write_instructions(const fs::path& path, int first, int count) {
  std::ofstream out(path);
  const char* kinds[] = {"a bird", "a small stone", "to run fast", "very old", "a kind of tree that grows by water"};
  for (int n = first; n < first + count; ++n) {
    out << R"({"prompt": "What does w)" << n << R"( mean?", "response": ")" << kinds[n % 5] << " of " << n % 7
        << R"(."})" << "\n";
  }
}

void write_data(const fs::path& root) {
  testing::write_byte_tokenizer(root / "tokenizer");
  write_instructions(root / "train.jsonl", 0, 64);
  write_instructions(root / "val.jsonl", 100, 12);
}

std::string base_config(const fs::path& root, const std::string& out) {
  return "[model]\nhidden_size = 32\nnum_hidden_layers = 2\nnum_attention_heads = 2\nffn_dim = 64\n"
         "max_position_embeddings = 64\ndropout = 0.0\n"
         "[data]\nkind = \"instructions\"\ntokenizer = \"" + (root / "tokenizer").string() + "\"\n"
         "train = \"" + (root / "train.jsonl").string() + "\"\nval = \"" + (root / "val.jsonl").string() + "\"\n"
         "context = 64\n"
         "[train]\nsteps = 6\nbatch_size = 8\nmicro_batch_size = 2\neval_rows = 8\nprogress = \"plain\"\n"
         "log_interval = 100\nout_dir = \"" + (root / out).string() + "\"\n"
         "[optim]\nlr = 3e-3\nwarmup_steps = 2\n[runtime]\nthreads = 1\ndevice = \"cpu\"\n"
         "[generate]\nmax_new_tokens = 8\n";
}

config::Config make_config(const fs::path& root, const std::string& out, const std::vector<std::string>& overrides = {}) {
  return config::Config::from_string(base_config(root, out), "test.toml", opt_schema(), overrides);
}

// Every shipped config loads against the schema; a published shape gives its model. (The demo's
// fine-tunes start from a folder the demo makes, so only their keys are checked.)
TEST(OPTConfigsTest, EveryShippedConfigValidates) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(KUAFU_SOURCE_DIR) / "apps/opt_finetune/configs")) {
    SCOPED_TRACE(entry.path().string());
    const config::Config config = config::Config::load(entry.path().string(), opt_schema());
    if (config.get_string("model.init_from").empty()) {
      EXPECT_GT(opt_data(config).context, 0);
    }
    if (!config.get_string("model.shape").empty()) {
      EXPECT_GT(model_config(config).parameter_count(), 0);  // cross-key checks (positions fit the context)
    }
    ++count;
  }
  EXPECT_GE(count, 11);
}

class OPTFinetuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::shared_test_dir(std::string("opt_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    if (!testing::is_worker()) {
      fs::remove_all(root_);
      write_data(root_);
    }
  }
  fs::path root_;
};

// A step's rows: BOS, prompt, answer, EOS; the targets are the answer and its EOS only, then padding
// (pad id 1, ignored) to the step's longest example rounded up to a multiple of 8.
TEST_F(OPTFinetuneTest, BatchesLearnTheAnswersOnly) {
  const auto config = make_config(root_, "batches");
  const io::BpeTokenizer tokenizer = load_tokenizer(config, opt_data(config));
  auto set = std::make_shared<io::InstructionSet>(
      io::read_instructions((root_ / "train.jsonl").string(), tokenizer, instruction_format(config, opt_data(config), tokenizer, model_config(config))));
  io::InstructionBatcher batcher(set, /*pad_id=*/1, /*global_batch=*/8, /*seed=*/5);
  const io::TokenBatch batch = batcher.train_batch(3, 2, 2);
  ASSERT_EQ(batch.inputs.size(0), 2);
  EXPECT_EQ(batch.inputs.size(1) % 8, 0);
  for (int64_t r = 0; r < 2; ++r) {
    const io::InstructionExample& e = set->examples[static_cast<size_t>(batcher.example_index(3, 2 + r))];
    const std::string text(e.tokens.begin() + 1, e.tokens.end() - 1);  // bytes between BOS and EOS
    const size_t answer = text.find('\n') + 1;
    for (int64_t i = 0; i < batch.inputs.size(1); ++i) {
      const int64_t target = batch.targets[r][i].item<int64_t>();
      const auto n = static_cast<int64_t>(e.tokens.size());
      if (i + 1 < n) {
        EXPECT_EQ(batch.inputs[r][i].item<int64_t>(), e.tokens[static_cast<size_t>(i)]);
      }
      if (i + 1 >= n) {
        EXPECT_EQ(batch.inputs[r][i].item<int64_t>(), 1) << "padding";
        EXPECT_EQ(target, io::kIgnoredTarget) << "padding";
      } else if (i + 1 < static_cast<int64_t>(answer) + 1) {
        EXPECT_EQ(target, io::kIgnoredTarget) << "prompt token " << i;
      } else {
        EXPECT_EQ(target, e.tokens[static_cast<size_t>(i + 1)]) << "answer token " << i;
      }
    }
    EXPECT_EQ(batch.targets[r].ne(io::kIgnoredTarget).sum().item<int64_t>(), e.learned_count());
  }
  // The same step from another split of rows gives the same rows.
  EXPECT_TRUE(torch::equal(batcher.train_batch(3, 0, 8).targets.narrow(0, 2, 2), batch.targets));
}

// Packed rows hold several examples, each attending only to itself from position 0: the loss and
// gradients equal those of the same examples one per row (float32, another summation order: 1e-5).
// Without the documents (one causal sequence per row, positions 0..T-1) the loss differs.
TEST_F(OPTFinetuneTest, PackedExamplesGiveTheUnpackedLossAndGradients) {
  const auto config = make_config(root_, "packed", {"data.pack=true", "data.context=192", "model.max_position_embeddings=192"});
  const io::BpeTokenizer tokenizer = load_tokenizer(config, opt_data(config));
  auto set = std::make_shared<io::InstructionSet>(
      io::read_instructions((root_ / "train.jsonl").string(), tokenizer, instruction_format(config, opt_data(config), tokenizer, model_config(config))));
  io::InstructionBatcher unpacked(set, 1, 8, 5);
  io::InstructionBatcher packed(set, 1, 8, 5, torch::kCPU, /*pack_to=*/192);
  const io::TokenBatch one_per_row = unpacked.eval_batch(0, 6);
  const io::TokenBatch rows = packed.packed_rows({{0, 1, 2}, {3, 4, 5}});
  ASSERT_EQ(rows.inputs.sizes(), (std::vector<int64_t>{2, 2, 192}));
  EXPECT_EQ(rows.targets.ne(io::kIgnoredTarget).sum().item<int64_t>(), one_per_row.targets.ne(io::kIgnoredTarget).sum().item<int64_t>());

  OPTForCausalLM model = build_opt(config, parallel::ModelOptions::serial_on(torch::kCPU));
  auto loss_and_grads = [&](const torch::Tensor& inputs, const torch::Tensor& targets) {
    model->zero_grad();
    torch::Tensor loss = model->loss(inputs, targets);
    loss.backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto [reference, reference_grads] = loss_and_grads(one_per_row.inputs, one_per_row.targets);
  const auto [loss, grads] = loss_and_grads(rows.inputs, rows.targets);
  EXPECT_NEAR(loss, reference, 1e-5);
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(torch::allclose(grads[i], reference_grads[i], 1e-4, 1e-6)) << i;
  const double crossing = model->loss(rows.inputs.select(1, 0), rows.targets).item<double>();
  EXPECT_GT(std::abs(crossing - reference), 1e-3) << "attention across examples and unrestarted positions must show";
  {  // Attention kept within each example, but positions counted from the row's start: differs too.
    torch::NoGradGuard no_grad;
    const torch::Tensor ids = rows.inputs.select(1, 0), documents = rows.inputs.select(1, 1);
    torch::Tensor x = model->embed_at(ids, torch::arange(ids.size(1)).unsqueeze(0));
    x = nn::run_blocks(model->decoder->blocks, x, nullptr, ops::AttentionMask({}, documents));
    EXPECT_GT(std::abs(model->tail_loss(x, rows.targets).item<double>() - reference), 1e-3) << "positions must restart";
  }

  // An epoch's packed rows hold every example once, each row within 192 tokens; a step's rows are the
  // same however they are split.
  std::vector<int> seen(set->examples.size(), 0);
  int64_t rows_in_epoch = 0;
  for (int64_t total = 0; total < static_cast<int64_t>(set->examples.size()); ++rows_in_epoch) {
    int64_t tokens = 0;
    for (int64_t index : packed.packed_row(rows_in_epoch)) {
      ++seen[static_cast<size_t>(index)];
      tokens += static_cast<int64_t>(set->examples[static_cast<size_t>(index)].tokens.size());
      ++total;
    }
    EXPECT_LE(tokens, 192);
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<int64_t>(set->examples.size()));
  EXPECT_LT(rows_in_epoch, static_cast<int64_t>(set->examples.size()) / 2) << "several examples per row";
  EXPECT_TRUE(torch::equal(packed.train_batch(2, 0, 8).inputs.narrow(0, 4, 4), packed.train_batch(2, 4, 4).inputs));

  // The trainer fine-tunes on packed rows.
  train::Runtime runtime = train::start_runtime(config);
  std::unique_ptr<OptTask> task = make_task(config, runtime);
  const train::TrainSummary summary = train::Trainer(config, runtime, *task).run();
  EXPECT_EQ(summary.steps_done, 6);
  EXPECT_TRUE(std::isfinite(summary.last_loss));
}

// As the GPT memory tests: 6 steps, dynamic loss scale, no clipping, chunks of 4 KiB; weights within
// 2e-5 and Adam's moments within 1e-4 of their own size (float32, only the order of the sums differs).
// One difference: k_proj's bias has an exactly zero gradient (softmax ignores a shift shared by every
// key), so its moments are rounding noise (~1e-12); moments are compared to at least 1e-6.
void sharded_finetuning_equals_plain(const fs::path& root, const std::shared_ptr<dist::World>& world, bool lora) {
  const std::vector<std::string> common = {"precision.loss_scale=\"dynamic\"", "precision.initial_scale=1024",
                                           "optim.grad_clip=0", "memory.chunk_mb=0.00390625", "dist.timeout_s=30",
                                           lora ? "lora.rank=4" : "lora.rank=0"};
  const std::string tag = lora ? "lora_" : "full_";
  auto train_with = [&](const std::string& strategy) {
    std::vector<std::string> overrides = common;
    overrides.push_back("memory.strategy=\"" + strategy + "\"");
    const auto config = make_config(root, tag + strategy, overrides);
    train::Runtime runtime = train::start_runtime(config, world);
    std::unique_ptr<OptTask> task = make_task(config, runtime);
    train::Trainer(config, runtime, *task).run();
  };
  train_with("none");
  for (const std::string strategy : {"zero2", "gemini"}) {
    train_with(strategy);
    if (world->rank() != 0) continue;
    testing::expect_same_tensors(testing::saved(root, tag + strategy, "model.safetensors"),
                                 testing::saved(root, tag + "none", "model.safetensors"), 2e-5, 1.0, strategy + " weights");
    testing::expect_same_tensors(testing::saved(root, tag + strategy, "optimizer.safetensors"),
                                 testing::saved(root, tag + "none", "optimizer.safetensors"), 1e-4, 1e-6,
                                 strategy + " optimizer state");
  }
}

TEST_F(OPTFinetuneTest, ShardedFineTuningOnTwoRanksEqualsPlain) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 180);
  sharded_finetuning_equals_plain(root_, testing::worker_world(), /*lora=*/false);
}

TEST_F(OPTFinetuneTest, ShardedLoraFineTuningOnTwoRanksEqualsPlainAndKeepsTheBase) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 180);
  const auto world = testing::worker_world();
  sharded_finetuning_equals_plain(root_, world, /*lora=*/true);
  if (world->rank() != 0) return;
  // The base weights are where the seed put them; the adapters moved.
  const auto config = make_config(root_, "lora_none", {"lora.rank=4"});
  OPTForCausalLM start = build_opt(config, parallel::ModelOptions::serial_on(torch::kCPU));
  const io::SafetensorsFile trained = testing::saved(root_, "lora_none", "model.safetensors");
  int adapters = 0;
  for (const auto& [name, tensor] : train::named_weights(*start)) {
    const torch::Tensor* after = trained.find(name);
    ASSERT_TRUE(after) << name;
    const bool adapter = nn::is_lora_parameter(name);
    adapters += adapter;
    EXPECT_EQ(torch::equal(*after, tensor), !adapter) << name;
  }
  EXPECT_EQ(adapters, 8);
}

// Plain SGD and no clipping, so that each step moves the weights by exactly lr x gradient (a gradient
// off by a factor shows; Adam's normalised steps would hide it).
void train_with_sgd(const fs::path& root, const std::string& name, const std::vector<std::string>& extra,
                    const std::shared_ptr<dist::World>& on) {
  std::vector<std::string> overrides = {"optim.name=\"sgd\"", "optim.momentum=0", "optim.weight_decay=0",
                                        "optim.grad_clip=0", "optim.lr=0.3", "dist.timeout_s=60"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  const auto config = make_config(root, name, overrides);
  train::Runtime runtime = train::start_runtime(config, on);
  std::unique_ptr<OptTask> task = make_task(config, runtime);
  train::Trainer(config, runtime, *task).run();
}

// Weights within 2e-5 (float32, another summation order) and every step's gradient norm within 1e-5 of
// its size.
void expect_same_steps(const fs::path& root, const std::string& run, const std::string& reference) {
  testing::expect_same_tensors(testing::saved(root, run, "model.safetensors"),
                               testing::saved(root, reference, "model.safetensors"), 2e-5, 1.0, run + " weights");
  const std::vector<double> norms = testing::grad_norms(root / run), expected = testing::grad_norms(root / reference);
  ASSERT_EQ(norms.size(), expected.size()) << run;
  for (size_t i = 0; i < norms.size(); ++i) EXPECT_NEAR(norms[i], expected[i], 1e-5 * expected[i]) << run << " step " << i + 1;
}

// Tensor (1D) and pipeline parallelism from the config, on 2 Gloo ranks, against one process. The loss
// is on the answers only, so the masked loss is checked across vocabulary blocks and pipeline stages too.
TEST_F(OPTFinetuneTest, TensorAndPipelineParallelFineTuningEqualsOneProcess) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 180);
  const auto world = testing::worker_world();
  if (world->rank() == 0) train_with_sgd(root_, "one_process", {}, dist::World::single());
  train_with_sgd(root_, "tensor", {"parallel.tensor.mode=\"1d\"", "parallel.tensor.size=2"}, world);
  train_with_sgd(root_, "pipeline", {"parallel.pipeline=2"}, world);
  if (world->rank() != 0) return;
  for (const std::string run : {"tensor", "pipeline"}) expect_same_steps(root_, run, "one_process");
}

// Packed rows (several examples in each row of 64 tokens, each attending only to itself) under pipeline
// stages and under every sequence-parallel mode: the documents travel with each micro-batch (the model's
// block_context), so each stage and each rank's attention keeps them apart, and every layout takes the
// one process's steps.
TEST_F(OPTFinetuneTest, PackedRowsTrainUnderPipelineAndSequenceParallelismAsInOneProcess) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 240);
  const auto world = testing::worker_world();
  const std::vector<std::string> packed = {"data.pack=true"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), packed.begin(), packed.end());
    return extra;
  };
  if (world->rank() == 0) train_with_sgd(root_, "packed_one_process", with({}), dist::World::single());
  train_with_sgd(root_, "packed_pipeline", with({"parallel.pipeline=2"}), world);
  for (const std::string mode : {"ring", "ring_scores", "all_to_all"}) {
    train_with_sgd(root_, "packed_" + mode, with({"parallel.sequence.mode=\"" + mode + "\"", "parallel.sequence.size=2"}),
                   world);
  }
  if (world->rank() != 0) return;
  for (const std::string run : {"pipeline", "ring", "ring_scores", "all_to_all"}) {
    expect_same_steps(root_, "packed_" + run, "packed_one_process");
  }
}

// LoRA with its frozen base in host memory, brought to the device one block at a time
// (memory.offload_frozen), or in files on the disk tier (memory.disk_dir): the same steps as with the base
// on the device, bit for bit (the same arithmetic on copies of the same weights). On this CPU both tiers are
// host memory; the memory it saves on a GPU is in docs/opt.md.
TEST_F(OPTFinetuneTest, LoraWithTheBaseOffloadedTrainsAsWithItOnTheDevice) {
  auto train_with = [&](const std::string& name, const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {"lora.rank=4", "memory.activation_checkpointing=true"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    const auto config = make_config(root_, name, overrides);
    train::Runtime runtime = train::start_runtime(config);
    std::unique_ptr<OptTask> task = make_task(config, runtime);
    train::Trainer(config, runtime, *task).run();
  };
  train_with("on_device", {});
  train_with("offloaded", {"memory.offload_frozen=true"});
  testing::expect_same_tensors(testing::saved(root_, "offloaded", "model.safetensors"),
                               testing::saved(root_, "on_device", "model.safetensors"), 0.0, 0.0, "weights");
  testing::expect_same_tensors(testing::saved(root_, "offloaded", "optimizer.safetensors"),
                               testing::saved(root_, "on_device", "optimizer.safetensors"), 0.0, 0.0, "optimizer state");
  // Between calls a frozen weight is its host copy; during its block's call, a copy made for the call.
  OPTForCausalLM model = build_opt(make_config(root_, "hooks", {"lora.rank=4"}), parallel::ModelOptions::serial_on(torch::kCPU));
  {
    const torch::Tensor weight = model->named_parameters()["model.decoder.layers.0.fc1.weight"];
    const void* built = weight.data_ptr();
    memory::FrozenWeightOffload offload(*model, torch::kCPU);
    const torch::Tensor adapter = model->named_parameters()["model.decoder.layers.0.self_attn.q_proj.lora_A.weight"];
    const void* home = weight.data_ptr();
    EXPECT_EQ(home, built) << "a weight already in host memory (lazy construction makes it there) is not copied";
    const void* adapter_home = adapter.data_ptr();
    const hooks::BlockCall call{"model.decoder.layers.0", {model->decoder->blocks[0].get()}};
    const torch::Tensor before = weight.detach().clone();
    offload.pre_backward(call);
    EXPECT_NE(weight.data_ptr(), home);
    EXPECT_TRUE(torch::equal(weight, before));
    EXPECT_EQ(adapter.data_ptr(), adapter_home) << "trainable weights stay where they are";
    offload.post_backward(call);
    EXPECT_EQ(weight.data_ptr(), home);
  }
  // The base's home in files on the disk tier (memory.disk_dir) instead: the same steps bit for bit, its
  // checkpoint written from the files; then both runs resumed for two more steps (the disk run reading the
  // checkpoint's base, the same values, into its files); the scratch folder gone after each run.
  const fs::path disk = root_ / "disk_tier";
  fs::create_directories(disk);
  const std::vector<std::string> on_disk = {"memory.offload_frozen=true", "memory.disk_dir=\"" + disk.string() + "\""};
  train_with("on_disk", on_disk);
  for (const int step : {6, 8}) {
    SCOPED_TRACE("step " + std::to_string(step));
    for (const std::string file : {"model.safetensors", "optimizer.safetensors"}) {
      testing::expect_same_tensors(testing::saved(root_, "on_disk", file, step), testing::saved(root_, "on_device", file, step),
                                   0.0, 0.0, file);
    }
    EXPECT_TRUE(fs::is_empty(disk));
    if (step == 6) {
      std::vector<std::string> longer = on_disk;
      longer.push_back("train.steps=8");
      train_with("on_disk", longer);
      train_with("on_device", {"train.steps=8"});
    }
  }
  const std::string message = testing::error_message([&] { train_with("no_checkpointing", {"memory.offload_frozen=true",
                                                                                        "memory.activation_checkpointing=false"}); });
  EXPECT_TRUE(testing::Contains(message, "memory.activation_checkpointing")) << message;
}

// The command line as a user runs it.
std::string write_config(const fs::path& root, const std::string& name, const std::string& extra) {
  const fs::path path = root / (name + ".toml");
  std::ofstream(path) << base_config(root, name) << extra;
  return path.string();
}

TEST_F(OPTFinetuneTest, CommandsFineTuneEvaluateGenerateAndExport) {
  const std::string program = KUAFU_OPT_PATH;
  const std::string lora = write_config(root_, "cli_lora", "[lora]\nrank = 4\n");
  const testing::CommandResult trained = testing::run_command(program + " finetune --config " + lora);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;

  // eval: the answers' perplexity after training is below the starting weights'.
  auto val_loss = [&](const std::string& checkpoint) {
    const testing::CommandResult r = testing::run_command(program + " eval --config " + lora + checkpoint);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return testing::last_json_line(r.output);
  };
  const nlohmann::json start = val_loss(" --checkpoint init"), end = val_loss("");
  EXPECT_EQ(start["data"], "answers");
  EXPECT_LT(end["val_loss"].get<double>(), start["val_loss"].get<double>());
  EXPECT_GT(end["tokens"].get<double>(), 12 * 10);  // the 12 answers' tokens and EOS, no prompt

  const testing::CommandResult sampled =
      testing::run_command(program + " generate --config " + lora + " --prompt \"What does w3 mean?\"");
  ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
  EXPECT_EQ(testing::last_json_line(sampled.output)["prompt"], "What does w3 mean?");

  // export: the merged folder loads as a plain OPT with the adapted logits; the adapter folder too.
  const fs::path merged = root_ / "merged", adapter = root_ / "adapter";
  for (const auto& [out, flag] : {std::pair{merged, ""}, std::pair{adapter, " --adapter"}}) {
    const testing::CommandResult r =
        testing::run_command(program + " export --config " + lora + " --out " + out.string() + flag);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  EXPECT_TRUE(fs::exists(merged / "vocab.json")) << "the tokenizer travels with the model";
  EXPECT_TRUE(fs::exists(adapter / "adapter_config.json") && fs::exists(adapter / "adapter_model.safetensors"));
  const auto config = config::Config::load(lora, opt_schema());
  OPTForCausalLM adapted = build_opt(config, parallel::ModelOptions::serial_on(torch::kCPU));
  train::CheckpointStore::load_model(train::checkpoint_to_read((root_ / "cli_lora").string(), ""), *adapted);
  const torch::Tensor tokens = torch::randint(3, 120, {2, 10});
  OPTForCausalLM plain = opt_format().load(merged.string());
  EXPECT_LT((plain->forward(tokens) - adapted->forward(tokens)).abs().max().item<double>(), 1e-5);

  // A second export into the same folder is refused and leaves it as it was.
  const testing::CommandResult again = testing::run_command(program + " export --config " + lora + " --out " + merged.string());
  EXPECT_NE(again.exit_code, 0);
  EXPECT_TRUE(testing::Contains(again.output, "already exists")) << again.output;
}

TEST_F(OPTFinetuneTest, BadInputIsNamed) {
  const std::string program = KUAFU_OPT_PATH;
  struct Case {
    std::string extra, expected;
  };
  const std::vector<Case> cases = {
      {"[lora]\nrank = 4\ntargets = [\"query\"]\n", "query"},
      {"[lora]\nrank = 4\ninit_from = \"" + (root_ / "nowhere").string() + "\"\n", "lora.init_from"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string config = write_config(root_, "bad" + std::to_string(n++), c.extra);
    const testing::CommandResult r = testing::run_command(program + " finetune --config " + config);
    EXPECT_NE(r.exit_code, 0) << c.extra;
    EXPECT_TRUE(testing::Contains(r.output, c.expected)) << r.output;
  }
  // A missing instruction file names its key.
  const std::string missing = write_config(root_, "missing", "");
  fs::remove(root_ / "val.jsonl");
  const testing::CommandResult r = testing::run_command(program + " finetune --config " + missing);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(testing::Contains(r.output, "data.val")) << r.output;
  // The shipped opt-66b config on this machine: the fit check names the shape it was given (a string)
  // and what it needs, instead of failing to read model.shape as an integer.
  const testing::CommandResult huge = testing::run_command(
      program + " finetune --config " + (fs::path(KUAFU_SOURCE_DIR) / "apps/opt_finetune/configs/opt-66b.toml").string());
  EXPECT_NE(huge.exit_code, 0);
  EXPECT_TRUE(testing::Contains(huge.output, "the model of model.shape = \"66b\" has ")) << huge.output;
  EXPECT_TRUE(testing::Contains(huge.output, "GiB")) << huge.output;
}

}  // namespace
}  // namespace kuafu::opt

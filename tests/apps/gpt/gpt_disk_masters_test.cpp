// Gemini's third tier through the trainer, on 1 and 2 Gloo ranks (bf16, a 4-layer GPT, 8 micro-steps
// of accumulation per step on one rank, clipping that binds, a dynamic loss scale that skips an
// overflowed step): with memory.disk_dir and a host budget that holds about half of the master chunks,
// the rest live on the disk and are stepped a chunk at a time as they stream through host memory. The
// run takes exactly the steps of the same run with every master chunk in host memory (the tier copies
// float32 bits to files and back, and the global norm adds the same squares in the same order), a
// checkpoint written from the disk resumes onto the disk and ends the same, the host budget holds, and
// no scratch folder outlives its run. Under placement = "auto" the device room the warm-up leaves takes
// master chunks off the disk, and the steps stay the same. The runs keep a moving average of the weights
// (optim.ema_decay), which lives in the disk records beside the optimizer state: it, and the evaluation
// that computes with it, are the same bits too.
#include <gtest/gtest.h>

#include <limits>

#include "tests/apps/gpt/gpt_training_support.h"
#include "tests/support/json_lines.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu::gpt {
namespace {

class GPTDiskMastersTest : public GPTTrainingTest {};

// As gpt_placement_test's runs, with clipping at 0.05 (below every step's gradient norm, measured 1.9-4.5)
// and every compute shard and master chunk in host memory unless the disk takes them.
const std::string kDiskBase =
    "train.batch_size=16\ntrain.micro_batch_size=2\ndist.timeout_s=30\nprecision.dtype=\"bf16\"\n"
    "precision.loss_scale=\"dynamic\"\nprecision.initial_scale=1024\nprecision.hysteresis=1\noptim.grad_clip=0.05\n"
    "model.n_embd=64\nmodel.n_layer=4\nmodel.n_head=4\nmemory.chunk_mb=0.00390625\nmemory.strategy=\"gemini\"\n"
    "memory.offload_param_fraction=1\nmemory.offload_optim_fraction=1";

// The equality runs keep a moving average of the weights.
const std::string kAveraged = "optim.ema_decay=0.9\n";

// The last step's line of a run's metrics (the memory figures; an evaluation's line may follow it).
nlohmann::json last_step(const std::vector<nlohmann::json>& lines) {
  for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
    if (line->contains("host_peak_mb")) return *line;
  }
  ADD_FAILURE() << "no step line with memory figures";
  return nlohmann::json::object();
}

// The auto run's device room beside the activations and chunks: at margin_ratio 0.5 it holds some of the
// master chunks (most of 2,048 elements, 32 KiB with their gradient and Adam's two slots; 14 of the disk's 21
// measured), not all.
constexpr double kAutoDeviceRoomMb = 2.0;

std::vector<nlohmann::json> train_run(const fs::path& root, const std::string& name, const std::string& extra,
                                      const std::shared_ptr<dist::World>& world, int64_t skipped = 1) {
  return train_with_an_overflow(root, name, kDiskBase + "\n" + extra, world, skipped);
}

void disk_tier_keeps_the_steps(const fs::path& root, const std::shared_ptr<dist::World>& world) {
  const auto in_memory = train_run(root, "in_memory", kAveraged, world);
  ASSERT_FALSE(in_memory.empty());
  // Every step's norm is above the clip, so a norm off by a rounding would scale every update differently.
  for (const auto& line : in_memory) {
    // (The overflowed step's norm is not finite: null in JSON.)
    if (line.contains("grad_norm") && line["grad_norm"].is_number()) {
      EXPECT_GT(line["grad_norm"].get<double>(), 0.05) << line.dump();
    }
  }
  const double host_mb = 0.6 * last_step(in_memory)["host_peak_mb"].get<double>();
  const fs::path scratch = root / "disk";
  if (world->rank() == 0) fs::create_directories(scratch);
  dist::barrier(*world->world_group());
  const std::string disk = kAveraged + "memory.host_budget_mb=" + std::to_string(host_mb) + "\nmemory.disk_dir=\"" +
                           scratch.string() + "\"";
  const auto on_disk = train_run(root, "on_disk", disk, world);
  // Auto placement: the device room the warm-up leaves (times margin_ratio) takes master chunks off the disk.
  // Without a device budget all of them; with one that leaves about kAutoDeviceRoomMb beside the activations
  // and the whole model's chunks, some (the rest stay on the disk).
  const std::string placed_auto = disk + "\nmemory.placement=\"auto\"\nmemory.margin_ratio=0.5\n"
                                  "memory.offload_param_fraction=0\nmemory.offload_optim_fraction=0";
  const nlohmann::json unlimited = last_step(train_run(root, "auto_unlimited", placed_auto, world));
  const double device_mb =
      unlimited["activations_peak_mb"].get<double>() + unlimited["chunks_mb"].get<double>() + kAutoDeviceRoomMb;
  const std::string budgeted = placed_auto + "\nmemory.device_budget_mb=" + std::to_string(device_mb);
  const nlohmann::json placed = last_step(train_run(root, "auto_budget", budgeted, world));
  // A checkpoint written from the disk after 3 steps resumes onto the disk (read into the records there),
  // under static placement and under auto (which then takes chunks off the disk with their loaded values).
  train_run(root, "written", disk + "\ntrain.steps=3", world);
  for (const std::string resumed : {"resumed", "resumed_auto"}) {
    if (world->rank() == 0) {
      fs::create_directories(root / resumed);
      fs::copy(root / "written" / "checkpoints", root / resumed / "checkpoints", fs::copy_options::recursive);
    }
    dist::barrier(*world->world_group());
    train_run(root, resumed, resumed == "resumed" ? disk : budgeted, world, /*skipped=*/0);
  }
  if (world->rank() != 0) return;
  const nlohmann::json figures = last_step(on_disk);
  ASSERT_TRUE(figures.contains("master_chunks_on_disk")) << figures.dump();
  // Some master chunks on each tier: both paths of the step run.
  const double static_on_disk = figures["master_chunks_on_disk"].get<double>();
  EXPECT_GT(static_on_disk, 0);
  EXPECT_GT(figures["master_chunks_on_host"].get<double>(), 0);
  EXPECT_LE(figures["host_peak_mb"].get<double>(), host_mb);
  EXPECT_GT(figures["disk_read_gb"].get<double>(), 0);
  EXPECT_GT(figures["disk_staging_peak_mb"].get<double>(), 0);
  // Auto: everything off the disk without a device budget; with one, fewer chunks there and fewer bytes read
  // than under static placement, within both budgets.
  EXPECT_EQ(unlimited["master_chunks_on_disk"].get<double>(), 0) << unlimited.dump();
  EXPECT_GT(placed["master_chunks_on_disk"].get<double>(), 0) << placed.dump();
  EXPECT_LT(placed["master_chunks_on_disk"].get<double>(), static_on_disk) << placed.dump();
  EXPECT_GT(placed["master_chunks_on_device"].get<double>(), 0) << placed.dump();
  EXPECT_LT(placed["disk_read_gb"].get<double>(), figures["disk_read_gb"].get<double>()) << placed.dump();
  EXPECT_LE(placed["device_peak_mb"].get<double>(), device_mb);
  EXPECT_LE(placed["host_peak_mb"].get<double>(), host_mb);
  // The same bits as with every master in host memory: weights and optimizer state, also after a resume.
  const auto last_eval_loss = [&](const std::string& run) {  // the evaluation computes with the average
    const nlohmann::json evaluation = testing::last_line_with(root / run / "metrics.jsonl", "val_loss");
    EXPECT_FALSE(evaluation.is_null()) << run << ": no evaluation";
    return evaluation.value("val_loss", -1.0);
  };
  for (const std::string run : {"on_disk", "auto_unlimited", "auto_budget", "resumed", "resumed_auto"}) {
    expect_same_run(root, run, "in_memory", 0.0);
    expect_same_tensors(saved(root, run, "ema.model.safetensors"), saved(root, "in_memory", "ema.model.safetensors"), 0.0,
                        1.0, run + " moving average");
    EXPECT_EQ(last_eval_loss(run), last_eval_loss("in_memory")) << run;
  }
  // Scratch folders go with their runs.
  EXPECT_TRUE(fs::is_empty(scratch)) << "a scratch folder was left in " << scratch;
}

TEST_F(GPTDiskMastersTest, MasterChunksOnTheDiskTakeTheSameStepsOnOneRank) {
  disk_tier_keeps_the_steps(root_, dist::World::single());
}

TEST_F(GPTDiskMastersTest, MasterChunksOnTheDiskTakeTheSameStepsOnTwoRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2, 240);
  disk_tier_keeps_the_steps(root_, testing::worker_world());
}

// The chunk-size search under a host budget with the disk tier keeps the tier's buffers (the chunk in use, one
// read ahead, one written behind: 48 bytes an element under AdamW) within an eighth of the budget, so the
// compute shards keep the rest. A 16-layer model of the same width: its largest tensor (16,384 elements) fits
// the bound at 8 MiB (21,845 elements); unbounded, the search takes chunks of 50,176 elements, whose buffers
// (2.3 MiB) would take over a quarter of the budget.
TEST_F(GPTDiskMastersTest, TheChunkSearchLeavesTheDiskBuffersAnEighthOfTheHostBudget) {
  const double host_mb = 8;
  const fs::path scratch = root_ / "disk";
  fs::create_directories(scratch);
  const auto lines = train_run(root_, "searched", "memory.chunk_mb=0\nmodel.n_layer=16\ntrain.steps=3\nmemory.host_budget_mb=" +
                                                      std::to_string(host_mb) + "\nmemory.disk_dir=\"" + scratch.string() + "\"",
                               dist::World::single());
  const nlohmann::json figures = last_step(lines);
  ASSERT_TRUE(figures.contains("disk_staging_peak_mb")) << figures.dump();
  EXPECT_GT(figures["master_chunks_on_disk"].get<double>(), 0) << figures.dump();
  EXPECT_GT(figures["disk_staging_peak_mb"].get<double>(), 0) << figures.dump();
  EXPECT_LE(figures["disk_staging_peak_mb"].get<double>(), host_mb / 8) << figures.dump();
  EXPECT_LE(figures["host_peak_mb"].get<double>(), host_mb) << figures.dump();
}

// A tensor above that bound (here a 1,024-token embedding, 65,536 elements: 1 MiB of master, Adam's slots and
// gradient) takes a chunk of its own instead of setting every chunk's size: the buffers hold it and two chunks
// within the bound (a third of the eighth each), where chunks of the embedding's size would hold 3 MiB.
TEST_F(GPTDiskMastersTest, ATensorAboveTheChunkBoundTakesAChunkOfItsOwn) {
  const double host_mb = 8, embedding_mb = 65536.0 * 16 / (1 << 20);
  const fs::path scratch = root_ / "disk";
  fs::create_directories(scratch);
  const auto lines = train_run(root_, "embedding", "memory.chunk_mb=0\nmodel.n_layer=16\nmodel.vocab_size=1024\ntrain.steps=3\n"
                                                   "memory.host_budget_mb=" + std::to_string(host_mb) +
                                                   "\nmemory.disk_dir=\"" + scratch.string() + "\"",
                               dist::World::single());
  const nlohmann::json figures = last_step(lines);
  ASSERT_TRUE(figures.contains("disk_staging_peak_mb")) << figures.dump();
  EXPECT_GT(figures["master_chunks_on_disk"].get<double>(), 0) << figures.dump();
  EXPECT_LE(figures["disk_staging_peak_mb"].get<double>(), embedding_mb + 2 * host_mb / 8 / 3) << figures.dump();
  EXPECT_LE(figures["host_peak_mb"].get<double>(), host_mb) << figures.dump();
}

TEST_F(GPTDiskMastersTest, TheDiskTierNeedsGeminiLowPrecisionAndSynchronousSaves) {
  auto runtime = single_runtime();
  const std::string dir = "memory.disk_dir=\"" + root_.string() + "\"";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"memory.strategy=\"zero2\"\n" + dir, "memory.disk_dir"},
      {"memory.strategy=\"gemini\"\nprecision.dtype=\"fp32\"\n" + dir, "memory.disk_dir"},
      {"memory.strategy=\"gemini\"\nprecision.dtype=\"bf16\"\nmemory.offload_optim_fraction=1\nmemory.host_budget_mb=0.5\n"
       "train.async_save=true\n" + dir,
       "train.async_save"}};
  for (const auto& [extra, key] : refused) {
    const auto config = make_config(root_, "refused", extra);
    auto task = make_text_task(config);
    const std::string message = testing::error_message([&] { train::Trainer(config, runtime, *task); });
    EXPECT_NE(message.find(key), std::string::npos) << extra << "\n" << message;
  }
}

}  // namespace
}  // namespace kuafu::gpt

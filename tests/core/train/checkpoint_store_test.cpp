// Checkpoint folders under bad input and faults: a missing or hostile `latest` pointer, a manifest that
// names files outside its folder, pruning after resuming from an older checkpoint, a trainer state
// whose step does not fit, and one run per out_dir (docs/reliability.md).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "core/dist/collectives.h"
#include "core/optim/algorithms.h"
#include "core/train/checkpoint.h"
#include "core/train/checkpoint_manifest.h"
#include "core/train/runtime.h"
#include "core/util/atomic_file.h"
#include "core/util/folder_lock.h"
#include "core/util/logging.h"
#include "tests/support/multiprocess.h"
#include "tests/support/optimizers.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {
namespace fs = std::filesystem;

using testing::Contains;
using testing::error_message;
using testing::temp_dir;

struct OneWeight : torch::nn::Module {
  OneWeight() { weight = register_parameter("weight", torch::randn({3, 4})); }
  torch::Tensor weight;
};

using testing::adamw_for;

// A store with checkpoints at `steps`, keeping `keep`.
struct Saved {
  Saved(const std::vector<int64_t>& steps, int keep = 10)
      : root((temp_dir("ckpt_store") / "checkpoints").string()),
        store(root, dist::World::single()->world_group(), keep),
        optimizer(adamw_for(model)) {
    for (int64_t step : steps) save(step);
  }
  void save(int64_t step) { store.save(step, train::named_weights(model), *optimizer, {{"fingerprint", {}}}); }
  std::string folder(int64_t step) const { return train::checkpoint_folder(root, step); }
  std::string root;
  train::CheckpointStore store;
  OneWeight model;
  std::unique_ptr<optim::Optimizer> optimizer;
};

// Rewrites a checkpoint file and seals the manifest again, as a careful forger would.
void forge(const std::string& folder, const std::string& file, const std::string& bytes) {
  write_file_atomic((fs::path(folder) / file).string(), bytes);
  auto manifest = nlohmann::json::parse(read_file((fs::path(folder) / "manifest.json").string()));
  const std::string path = (fs::path(folder) / file).string();
  manifest["files"][file] = {{"bytes", fs::file_size(path)}, {"crc32", file_crc32(path)}};
  write_file_atomic((fs::path(folder) / "manifest.json").string(), manifest.dump());
}

// Before: a missing pointer meant "no checkpoint", and a run started from step 0 over the folders.
TEST(CheckpointStoreTest, AMissingLatestPointerTakesTheNewestCompleteCheckpoint) {
  Saved saved({10, 20});
  fs::create_directories(saved.folder(30));  // a folder without a manifest: not a checkpoint
  fs::remove(fs::path(saved.root) / "latest");
  ASSERT_TRUE(saved.store.latest());
  EXPECT_EQ(*saved.store.latest(), saved.folder(20));
  // Step folders none of which is complete: refused rather than trained over.
  fs::remove_all(saved.folder(10));
  fs::remove_all(saved.folder(20));
  EXPECT_TRUE(Contains(error_message([&] { saved.store.latest(); }), "refusing to start over them"));
}

// Before: a damaged newest checkpoint was refused with no way on but by hand. The newest intact one is
// taken instead (the damage named in a warning); when none is intact, the newest's error stands.
TEST(CheckpointStoreTest, ADamagedNewestCheckpointFallsBackToTheNewestIntactOne) {
  Saved saved({10, 20, 30});
  for (const int64_t step : {30, 20}) {
    write_file_atomic((fs::path(saved.folder(step)) / "model.safetensors").string(), "damaged bytes");
  }
  ASSERT_EQ(*saved.store.latest(), saved.folder(30));
  const auto intact = saved.store.latest_intact();
  ASSERT_TRUE(intact);
  EXPECT_EQ(intact->first, saved.folder(10));
  EXPECT_EQ(intact->second.at("step"), 10) << "its trainer state comes with it";
  write_file_atomic((fs::path(saved.folder(10)) / "model.safetensors").string(), "damaged bytes");
  EXPECT_TRUE(Contains(error_message([&] { saved.store.latest_intact(); }), saved.folder(30)));
}

// Before: resuming at step 10 with keep = 1 and then saving step 11 deleted step 11 (the newest by name
// was step 30) and left `latest` naming a deleted folder.
TEST(CheckpointStoreTest, PruningKeepsTheCheckpointJustSavedAndLaterOnes) {
  Saved saved({10, 20, 30});
  train::CheckpointStore keep_one(saved.root, dist::World::single()->world_group(), /*keep=*/1);
  keep_one.save(11, train::named_weights(saved.model), *saved.optimizer, {{"fingerprint", {}}});
  EXPECT_TRUE(fs::exists(saved.folder(11)));
  EXPECT_EQ(*saved.store.latest(), saved.folder(11));
  EXPECT_FALSE(fs::exists(saved.folder(10))) << "older than the one saved: pruned";
  EXPECT_TRUE(fs::exists(saved.folder(30))) << "another history's later checkpoint is kept";
  EXPECT_EQ(saved.store.later_than(11), (std::vector<std::string>{"step_00000020", "step_00000030"}));
}

// Flips one byte in the middle of a file: the size stays, only the CRC-32 can tell.
void flip_a_byte(const fs::path& file) {
  std::string bytes = read_file(file.string());
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  write_file_atomic(file.string(), bytes);
}

nlohmann::json manifest_files(const std::string& folder) {
  return nlohmann::json::parse(read_file((fs::path(folder) / "manifest.json").string())).at("files");
}

// Before: every rank read every file of the checkpoint for its CRC-32. Shared, each file is checked by
// exactly one share, and the shares' bytes are balanced largest file first.
TEST(CheckpointStoreTest, ASharedVerificationChecksEachFileOnce) {
  Saved saved({10});
  const std::string folder = saved.folder(10);
  const nlohmann::json files = manifest_files(folder);
  ASSERT_GE(files.size(), 4u) << files.dump();
  // Worked by hand: sizes 9, 7, 5, 4, 1 over two shares go 9 -> 0, 7 -> 1, 5 -> 1, 4 -> 0, 1 -> 1 (the
  // share with fewer bytes each time, the lower index on a tie), in the table's order.
  const nlohmann::json sized = {{"a", {{"bytes", 4u}}}, {"b", {{"bytes", 9u}}}, {"c", {{"bytes", 1u}}},
                                {"d", {{"bytes", 7u}}}, {"e", {{"bytes", 5u}}}};
  EXPECT_EQ(train::crc_checkers(sized, 2), (std::vector<int>{0, 0, 1, 1, 1}));
  EXPECT_EQ(train::crc_checkers(sized, 1), (std::vector<int>{0, 0, 0, 0, 0}));
  size_t position = 0;
  for (const auto& [name, entry] : files.items()) {
    SCOPED_TRACE(name);
    const auto path = fs::path(folder) / name;
    const std::string intact = read_file(path.string());
    flip_a_byte(path);
    for (const int count : {2, 3}) {
      const int checker = train::crc_checkers(files, count)[position];
      for (int index = 0; index < count; ++index) {
        const std::string error = error_message([&] { train::verify_manifest(folder, {index, count}); });
        if (index == checker) {
          EXPECT_TRUE(Contains(error, name) && Contains(error, "CRC-32")) << error;
        } else {
          EXPECT_EQ(error, "") << "share " << index << " of " << count << " read a file dealt to share " << checker;
        }
      }
    }
    write_file_atomic(path.string(), intact);
    ++position;
  }
}

// Bytes this process has read through system calls (/proc/self/io's rchar).
uint64_t bytes_read_by_this_process() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  ADD_FAILURE() << "/proc/self/io has no rchar";
  return 0;
}

// Two ranks resuming share the CRC checks: each reads about half the checkpoint (measured by the kernel's
// count of bytes read), and damage that only rank 1 reads makes both fall back to the same intact
// checkpoint, both naming the damaged file.
TEST(CheckpointStoreTest, RanksShareTheChecksumReadsAndAgreeOnDamage) {
  const fs::path dir = testing::shared_test_dir("ckpt_shared_crc");
  if (!testing::is_worker()) {
    fs::remove_all(dir);
    testing::run_test_on_ranks(2);
    fs::remove_all(dir);
    return;
  }
  auto world = testing::worker_world();
  const dist::GroupPtr group = world->world_group();
  struct Wide : torch::nn::Module {
    Wide() { weight = register_parameter("weight", torch::randn({512, 512})); }  // 1 MiB
    torch::Tensor weight;
  } model;
  auto optimizer = adamw_for(model);
  model.weight.mutable_grad() = torch::ones_like(model.weight);
  optimizer->step();  // AdamW's two moments exist from the first step on
  train::CheckpointStore store((dir / "checkpoints").string(), group, /*keep=*/10);
  for (const int64_t step : {10, 20}) store.save(step, train::named_weights(model), *optimizer, {{"fingerprint", {}}});
  const std::string newest = train::checkpoint_folder(store.root(), 20);
  const nlohmann::json files = manifest_files(newest);
  uint64_t total = 0;
  for (const auto& [name, entry] : files.items()) total += entry.at("bytes").get<uint64_t>();

  const uint64_t before = bytes_read_by_this_process();
  const auto intact = store.latest_intact();
  const uint64_t read = bytes_read_by_this_process() - before;
  ASSERT_TRUE(intact);
  EXPECT_EQ(intact->first, newest);
  // The files are the optimizer's two moments (2 MiB), the model (1 MiB) and small ones: one rank checks
  // the optimizer's file, the other the model's and the rest, so each reads 1/3 or 2/3 of the bytes,
  // plus the manifest and trainer state (a few KiB). Unshared, each read all of them.
  EXPECT_LT(static_cast<double>(read), 0.75 * static_cast<double>(total)) << "read " << read << " of " << total;
  EXPECT_GT(static_cast<double>(read), 0.25 * static_cast<double>(total)) << "read " << read << " of " << total;

  // Damage a file that rank 1 checks and rank 0 does not.
  const std::vector<int> checkers = train::crc_checkers(files, 2);
  std::string damaged;
  size_t position = 0;
  for (const auto& [name, entry] : files.items()) {
    if (checkers[position++] == 1 && damaged.empty()) damaged = name;
  }
  ASSERT_FALSE(damaged.empty());
  if (group->rank() == 0) flip_a_byte(fs::path(newest) / damaged);
  // Rank 0 alone has verified step 10 already (its cache holds it, rank 1's does not): the shared check
  // below still runs on both ranks, not on rank 1 alone waiting for a partner.
  if (group->rank() == 0) train::CheckpointStore::read_trainer_state(train::checkpoint_folder(store.root(), 10));
  dist::barrier(*group);
  // Both ranks refuse it in rank 1's words, then both take the same intact checkpoint.
  const std::string error = error_message([&] { train::CheckpointStore::read_trainer_state(newest, group.get()); });
  EXPECT_TRUE(Contains(error, damaged) && Contains(error, "CRC-32")) << "rank " << group->rank() << ": " << error;
  const auto fallback = store.latest_intact();
  ASSERT_TRUE(fallback);
  EXPECT_EQ(fallback->first, train::checkpoint_folder(store.root(), 10));
  dist::barrier(*group);
}

TEST(CheckpointStoreTest, LatestIsAPlainStepNameBesideIt) {
  Saved saved({10});
  const fs::path pointer = fs::path(saved.root) / "latest";
  for (const std::string bad : {"../elsewhere", "/etc", "step_10/../../x", "checkpoints"}) {
    write_file_atomic(pointer.string(), bad + "\n");
    EXPECT_TRUE(Contains(error_message([&] { saved.store.latest(); }), "does not hold a step_N name")) << bad;
  }
  // A link is never followed, and what it points at is never printed.
  const fs::path secret = temp_dir("ckpt_secret") / "passwd";
  std::ofstream(secret) << "root:x:0:0:secret-line\n";
  fs::remove(pointer);
  fs::create_symlink(secret, pointer);
  const std::string message = error_message([&] { saved.store.latest(); });
  EXPECT_TRUE(Contains(message, "not a regular file")) << message;
  EXPECT_EQ(message.find("secret-line"), std::string::npos) << message;
  fs::remove(pointer);
  write_file_atomic(pointer.string(), std::string(1000, 'x'));
  EXPECT_TRUE(Contains(error_message([&] { saved.store.latest(); }), "holds 1000 bytes"));
}

TEST(CheckpointStoreTest, ManifestNamesOnlyFilesInsideTheFolder) {
  Saved saved({10});
  const fs::path secret = temp_dir("ckpt_secret2") / "passwd";
  std::ofstream(secret) << "root:x:0:0\n";
  const std::string manifest_path = (fs::path(saved.folder(10)) / "manifest.json").string();
  const auto original = nlohmann::json::parse(read_file(manifest_path));
  for (const std::string& bad : std::vector<std::string>{"../../passwd", secret.string(), "sub/file", ".."}) {
    auto manifest = original;
    manifest["files"][bad] = {{"bytes", 11}, {"crc32", 0}};
    write_file_atomic(manifest_path, manifest.dump());
    const std::string message = error_message([&] { train::CheckpointStore::read_trainer_state(saved.folder(10)); });
    EXPECT_TRUE(Contains(message, "not a plain file name")) << bad << ": " << message;
  }
}

// Before: a step of -5 trained with negative learning rates and 1e18 printed "nothing to do", both
// exiting 0.
TEST(CheckpointStoreTest, TheTrainerStateStepMustFitTheCheckpoint) {
  Saved saved({10});
  const std::string folder = saved.folder(10);
  const std::string original = read_file((fs::path(folder) / "trainer.json").string());
  auto with_step = [&](const std::string& step) {
    auto state = nlohmann::json::parse(original);
    state["step"] = nlohmann::json::parse(step);
    forge(folder, "trainer.json", state.dump());
    return error_message([&] { train::CheckpointStore::read_trainer_state(folder); });
  };
  EXPECT_TRUE(Contains(with_step("-5"), "whole number >= 0")) << with_step("-5");
  EXPECT_TRUE(Contains(with_step("1e18"), "whole number >= 0"));
  EXPECT_TRUE(Contains(with_step("1000000000000000000"), "but the folder is step_00000010"));
  EXPECT_TRUE(Contains(with_step("\"10\""), "whole number >= 0"));
  // The optimizer's own count must fit too (it may trail the trainer's by skipped fp16 steps only).
  OneWeight other;
  auto optimizer = adamw_for(other);
  forge(folder, "trainer.json", original);
  saved.save(3);  // the optimizer has taken 0 steps: fits any step
  EXPECT_NO_THROW(train::CheckpointStore::load(saved.folder(3), train::named_weights(other), *optimizer, {}));
  saved.model.weight.sum().backward();
  saved.optimizer->step();
  saved.optimizer->step();
  saved.optimizer->step();
  saved.optimizer->step();
  saved.save(2);  // 4 optimizer steps in a checkpoint of step 2
  EXPECT_TRUE(Contains(error_message([&] {
                         train::CheckpointStore::load(saved.folder(2), train::named_weights(other), *optimizer, {});
                       }),
                       "the optimizer took 4 steps"));
}

// Before: these reached the user as bare JSON-library text ("[json.exception.type_error.302] type must be
// number, but is string") naming no file.
TEST(CheckpointStoreTest, WrongTypesInTheManifestOrTrainerStateNameTheFileAndKey) {
  Saved saved({10});
  const std::string folder = saved.folder(10);
  const std::string manifest_path = (fs::path(folder) / "manifest.json").string();
  auto manifest = nlohmann::json::parse(read_file(manifest_path));
  manifest["step"] = "x";
  write_file_atomic(manifest_path, manifest.dump());
  std::string message = error_message([&] { train::CheckpointStore::read_trainer_state(folder); });
  EXPECT_TRUE(Contains(message, manifest_path + ": \"step\" must be a whole number, found \"x\"")) << message;

  // The world size is read only to explain a missing RNG file.
  Saved other({10});
  const std::string folder2 = other.folder(10);
  auto state = nlohmann::json::parse(read_file((fs::path(folder2) / "trainer.json").string()));
  state["world_size"] = "x";
  forge(folder2, "trainer.json", state.dump());
  fs::remove(fs::path(folder2) / "rng_rank0.safetensors");
  manifest = nlohmann::json::parse(read_file((fs::path(folder2) / "manifest.json").string()));
  manifest["files"].erase("rng_rank0.safetensors");
  write_file_atomic((fs::path(folder2) / "manifest.json").string(), manifest.dump());
  OneWeight model;
  auto optimizer = adamw_for(model);
  message = error_message([&] { train::CheckpointStore::load(folder2, train::named_weights(model), *optimizer, {}); });
  EXPECT_TRUE(Contains(message, (fs::path(folder2) / "trainer.json").string() +
                                    ": \"world_size\" must be a whole number, found \"x\""))
      << message;
}

// Before: a fingerprint value that was not a string made the resume check throw "[json.exception.
// type_error.302] type must be string, but is number".
TEST(CheckpointStoreTest, TheFingerprintMustBeATableOfSettingTexts) {
  Saved saved({10});
  const std::string folder = saved.folder(10);
  const std::string path = (fs::path(folder) / "trainer.json").string();
  auto state = nlohmann::json::parse(read_file(path));
  for (const std::string bad : {"[1]", "\"x\"", R"({"model.n_embd": 64})"}) {
    state["fingerprint"] = nlohmann::json::parse(bad);
    forge(folder, "trainer.json", state.dump());
    const std::string message = error_message([&] { train::CheckpointStore::read_trainer_state(folder); });
    EXPECT_TRUE(Contains(message, path + ": \"fingerprint\" must be a table of setting texts")) << bad;
  }
  EXPECT_TRUE(Contains(error_message([&] { train::CheckpointStore::read_trainer_state(folder); }),
                       "\"model.n_embd\" is 64"));
  state["fingerprint"] = {{"model.n_embd", "64"}};
  forge(folder, "trainer.json", state.dump());
  EXPECT_NO_THROW(train::CheckpointStore::read_trainer_state(folder));
}

// Before: an out_dir under a file threw std::filesystem::filesystem_error, which the trainer's main rank
// did not catch as a refusal (the other ranks then waited for it) and which named no key.
TEST(FolderLockTest, AFolderThatCannotBeCreatedNamesTheKey) {
  const fs::path file = temp_dir("lock_file") / "a-file";
  std::ofstream(file) << "x";
  const std::string folder = (file / "run").string();
  const std::string message = error_message([&] { FolderLock lock(folder, "train.out_dir"); });
  EXPECT_TRUE(Contains(message, "train.out_dir = " + folder + ": cannot create the folder")) << message;
}

// Before: "filesystem error: cannot create directories: Not a directory [...]".
TEST(FolderLockTest, ALogFolderThatCannotBeCreatedIsNamed) {
  const fs::path file = temp_dir("log_file") / "a-file";
  std::ofstream(file) << "x";
  const std::string folder = (file / "logs").string();
  const std::string message = error_message([&] { log::configure(0, 1, folder, false); });
  log::configure(0, 1, "", false);
  EXPECT_TRUE(Contains(message, "cannot create the log folder " + folder + ": Not a directory")) << message;
}

// Before: two runs could share an out_dir. The lock is per open file, so a second one in this process
// stands for a second run; a process that dies without cleaning up leaves no lock behind.
TEST(FolderLockTest, OneRunPerFolderAndNoStaleLockAfterACrash) {
  const std::string folder = (temp_dir("lock") / "run").string();
  {
    FolderLock first(folder, "train.out_dir");
    const std::string message = error_message([&] { FolderLock second(folder, "train.out_dir"); });
    EXPECT_TRUE(Contains(message, "is in use by another run")) << message;
    EXPECT_TRUE(Contains(message, "process " + std::to_string(::getpid()))) << message;
  }
  EXPECT_NO_THROW(FolderLock again(folder, "train.out_dir"));
  const pid_t child = ::fork();
  if (child == 0) {
    new FolderLock(folder, "train.out_dir");  // never released by the program
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NO_THROW(FolderLock after_crash(folder, "train.out_dir"));
}

// Before: a single-process run stopped by SIGINT or SIGTERM exited 0 (kuafu-run said 130).
TEST(ExitCodeTest, AStopBySignalExitsWith128PlusTheSignal) {
  train::install_stop_signals();
  EXPECT_EQ(train::run_app_command("test", [] { std::raise(SIGTERM); }), 128 + SIGTERM);
  train::clear_stop_request();
  EXPECT_EQ(train::run_app_command("test", [] { std::raise(SIGINT); }), 128 + SIGINT);
  train::clear_stop_request();
  EXPECT_EQ(train::run_app_command("test", [] {}), 0);
  EXPECT_EQ(train::run_app_command("test", [] { throw Error("bad"); }), 1);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

}  // namespace
}  // namespace kuafu

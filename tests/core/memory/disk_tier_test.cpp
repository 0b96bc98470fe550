// Gemini's disk tier (core/memory/disk_tier.h): every byte comes back as written, through O_DIRECT and
// through the page cache, aligned or not; a read follows the writes queued before it; the budget, a full
// disk and a file changed outside the run are errors that name what and where; each run's scratch folder
// is its own, locked, removed when the tier ends, and a dead run's folder is cleaned up.
#include <gtest/gtest.h>

#include <unistd.h>

#include <signal.h>
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <vector>

#include "core/memory/disk_tier.h"
#include "core/util/folder_lock.h"
#include "core/util/error.h"

namespace kuafu::memory {
namespace {
namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("disk_tier_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<char> random_bytes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> bytes(static_cast<size_t>(n));
  for (char& b : bytes) b = static_cast<char>(rng());
  return bytes;
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

class DiskTierRoundTrip : public ::testing::TestWithParam<bool> {};

// Sizes around O_DIRECT's 4 KiB and the 8 MiB a call moves, from memory at an aligned address and one byte
// past it; written all at once, read back in the other order into fresh memory.
TEST_P(DiskTierRoundTrip, EveryByteComesBackAsWritten) {
  const bool direct = GetParam();
  DiskTier tier({fresh_dir(direct ? "direct" : "cached").string(), 0, 3, direct});
  std::cout << "  " << ::testing::TempDir() << (tier.direct() ? " takes O_DIRECT" : ": the page cache") << "\n";
  const std::vector<int64_t> sizes{0, 1, 4095, 4096, 4097, (int64_t{8} << 20) + 3, int64_t{20} << 20};
  std::vector<std::vector<char>> sources;  // each with one spare byte in front, for the unaligned start
  std::vector<DiskTransfer> writes;
  for (size_t i = 0; i < sizes.size() * 2; ++i) {
    const int64_t n = sizes[i % sizes.size()];
    sources.push_back(random_bytes(n + 4097, static_cast<uint32_t>(i)));
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    const int64_t n = sizes[i % sizes.size()];
    char* from = sources[i].data() + (i < sizes.size() ? 0 : 1);
    writes.push_back(tier.write(static_cast<int64_t>(i), from, n));
  }
  for (const DiskTransfer& w : writes) w.wait();
  for (size_t k = sources.size(); k-- > 0;) {
    const int64_t n = sizes[k % sizes.size()];
    std::vector<char> back(static_cast<size_t>(n + 1), 0);
    char* into = back.data() + (k % 2);
    tier.read(static_cast<int64_t>(k), into, n).wait();
    EXPECT_EQ(std::memcmp(into, sources[k].data() + (k < sizes.size() ? 0 : 1), static_cast<size_t>(n)), 0) << "chunk " << k << ", " << n << " bytes";
  }
  const DiskTier::Totals totals = tier.totals();
  int64_t total = 0;
  for (size_t i = 0; i < sources.size(); ++i) total += sizes[i % sizes.size()];
  EXPECT_EQ(totals.bytes_written, total);
  EXPECT_EQ(totals.bytes_read, total);
}

INSTANTIATE_TEST_SUITE_P(DirectAndCached, DiskTierRoundTrip, ::testing::Bool());

// Transfers of one chunk keep their queued order without the caller waiting in between: a read queued
// after a write sees it, and a later write does not reach an earlier read.
TEST(DiskTierTest, AReadFollowsTheWritesQueuedBeforeIt) {
  DiskTier tier({fresh_dir("order").string(), 0, 4});
  const int64_t n = int64_t{3} << 20;
  const std::vector<char> a = random_bytes(n, 1), b = random_bytes(n, 2);
  std::vector<char> first(static_cast<size_t>(n)), second(static_cast<size_t>(n));
  for (int round = 0; round < 5; ++round) {
    tier.write(7, a.data(), n);
    const DiskTransfer r1 = tier.read(7, first.data(), n);
    tier.write(7, b.data(), n);
    const DiskTransfer r2 = tier.read(7, second.data(), n);
    r1.wait();
    r2.wait();
    EXPECT_EQ(first, a) << "round " << round;
    EXPECT_EQ(second, b) << "round " << round;
  }
  tier.wait_all();
}

// memory.disk_budget_gb holds at the moment a write is queued (files count at 4 KiB multiples); a chunk
// replaced or dropped gives its bytes back; a read of a chunk never written, or of another size, is named.
TEST(DiskTierTest, TheBudgetAndBadReadsAreNamed) {
  DiskTier tier({fresh_dir("budget").string(), 16384});
  const std::vector<char> bytes(12288, 'x');
  tier.write(0, bytes.data(), 8192).wait();
  const std::string over = error_of([&] { tier.write(1, bytes.data(), 12288); });
  EXPECT_NE(over.find("memory.disk_budget_gb"), std::string::npos) << over;
  EXPECT_NE(over.find("chunk 1"), std::string::npos) << over;
  tier.write(1, bytes.data(), 8000).wait();  // 8 KiB on disk: 16 KiB in all
  EXPECT_EQ(tier.bytes_held(), 16384);
  tier.write(0, bytes.data(), 100).wait();  // replaced: 4 KiB + 8 KiB
  EXPECT_EQ(tier.bytes_held(), 12288);
  tier.drop(1);
  tier.wait_all();
  EXPECT_EQ(tier.bytes_held(), 4096);
  EXPECT_EQ(tier.peak_bytes(), 16384);
  std::vector<char> back(8192);
  EXPECT_NE(error_of([&] { tier.read(1, back.data(), 8000); }).find("never written"), std::string::npos);
  EXPECT_NE(error_of([&] { tier.read(0, back.data(), 99); }).find("holds 100 bytes"), std::string::npos);
}

// A write the file system refuses (here the process's file-size limit, as a full disk refuses it) fails
// its transfer with the cause, the chunk and the file, and so does a read of a file changed outside the run.
TEST(DiskTierTest, AFullDiskOrAChangedFileIsAnError) {
  DiskTier tier({fresh_dir("full").string(), 0, 2});
  const std::vector<char> bytes = random_bytes(int64_t{4} << 20, 3);
  {
    rlimit saved{};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
    const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG
    rlimit small = saved;
    small.rlim_cur = 1 << 20;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    const std::string full = error_of([&] { tier.write(5, bytes.data(), static_cast<int64_t>(bytes.size())).wait(); });
    ::setrlimit(RLIMIT_FSIZE, &saved);
    ::signal(SIGXFSZ, old_handler);
    EXPECT_NE(full.find("the disk is full"), std::string::npos) << full;
    EXPECT_NE(full.find("chunk 5"), std::string::npos) << full;
    EXPECT_NE(full.find(tier.folder()), std::string::npos) << full;
  }
  tier.write(6, bytes.data(), static_cast<int64_t>(bytes.size())).wait();
  fs::resize_file(fs::path(tier.folder()) / "chunk-6.bin", 1 << 20);
  std::vector<char> back(bytes.size());
  const std::string changed = error_of([&] { tier.read(6, back.data(), static_cast<int64_t>(back.size())).wait(); });
  EXPECT_NE(changed.find("ends early"), std::string::npos) << changed;
}

// Each tier makes and locks its own folder and removes it at its end; a folder a dead run left (its lock
// free, its process gone) is removed by the next tier, while a folder still being made (no lock file yet, or
// its lock not yet taken by its live process) and anything else in memory.disk_dir are left alone. A memory.disk_dir that does not exist is named.
TEST(DiskTierTest, EachRunHasItsOwnScratchFolder) {
  const fs::path dir = fresh_dir("scratch");
  const fs::path dead = dir / (std::string(DiskTier::kScratchPrefix) + "999999999-0");
  const fs::path starting = dir / (std::string(DiskTier::kScratchPrefix) + "999999999-1");
  fs::create_directories(dead);
  std::ofstream(FolderLock::lock_file(dead.string())) << "999999999\n";
  std::ofstream(dead / "chunk-0.bin") << "stale";
  fs::create_directories(starting);
  // A live run's folder between its lock file and its lock (this process stands for the run): never probed.
  const fs::path live = dir / (std::string(DiskTier::kScratchPrefix) + std::to_string(::getpid()) + "-7");
  fs::create_directories(live);
  std::ofstream(FolderLock::lock_file(live.string())) << "";
  fs::create_directories(dir / "keep");
  std::string first_folder;
  {
    DiskTier first({dir.string()}), second({dir.string()});
    first_folder = first.folder();
    EXPECT_NE(first.folder(), second.folder());
    EXPECT_TRUE(FolderLock::held(first.folder()));
    EXPECT_TRUE(FolderLock::held(second.folder()));
    EXPECT_FALSE(fs::exists(dead)) << "a dead run's folder is cleaned up";
    EXPECT_TRUE(fs::exists(starting));
    EXPECT_TRUE(fs::exists(live)) << "a live run's folder is left alone before it takes its lock";
    EXPECT_TRUE(fs::exists(dir / "keep"));
    const char byte = 'k';
    first.write(0, &byte, 1).wait();
    EXPECT_TRUE(fs::exists(fs::path(first.folder()) / "chunk-0.bin"));
  }
  EXPECT_FALSE(fs::exists(first_folder)) << "removed when the tier ends";
  const std::string missing = error_of([&] { DiskTier tier({(dir / "absent").string()}); });
  EXPECT_NE(missing.find("memory.disk_dir"), std::string::npos) << missing;
  EXPECT_NE(missing.find("absent"), std::string::npos) << missing;
}

}  // namespace
}  // namespace kuafu::memory

// Multi-process GoogleTests: the test re-runs itself as N worker processes of this binary with
// the torchrun environment, and the parent test fails when any worker fails or hangs.
//
//   TEST(DataParallelTest, TwoRanksMatchSerial) {
//     if (!kuafu::testing::is_worker()) { kuafu::testing::run_test_on_ranks(2); return; }
//     // worker body: runs in each of the 2 processes; RANK, WORLD_SIZE, ... are set
//   }
#pragma once

#include <filesystem>
#include <map>
#include <string>

namespace kuafu::testing {

// True inside a worker started by run_test_on_ranks (KUAFU_TEST_WORKER=1).
bool is_worker();

// Rank and world size of this worker, read from the torchrun variables.
int worker_rank();
int worker_world_size();

// Runs the current test in `world` worker processes (--gtest_filter=Suite.Name) with RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT and
// `extra_env`, and waits for them. Adds a test failure, with the tail of the worker's output,
// for every worker that fails, for a timeout (naming the workers still running), and when the
// workers cannot start or never reach the test. Skips the test when the workers skipped it.
void run_test_on_ranks(int world, int timeout_s = 60,
                       const std::map<std::string, std::string>& extra_env = {});

// <temp>/kuafu_<name>_<pid of the test process>: the same folder in the test process and in the workers
// it starts, so workers find what their parent wrote there. Neither created nor cleared.
std::filesystem::path shared_test_dir(const std::string& name);

}  // namespace kuafu::testing

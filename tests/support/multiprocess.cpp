#include "tests/support/multiprocess.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/dist/launch_env.h"
#include "core/dist/launcher.h"
#include "core/util/error.h"

namespace kuafu::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kWorkerVar = "KUAFU_TEST_WORKER";
// A file the worker creates when it reaches the test: exit code 0 alone could also mean that the
// filter matched no test at all.
constexpr const char* kStartedVar = "KUAFU_TEST_WORKER_STARTED";
constexpr int kTailLines = 60;
constexpr double kGraceSeconds = 2.0;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string output_tail(const fs::path& path, int rank) {
  std::istringstream in(read_file(path));
  std::deque<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > kTailLines) lines.pop_front();
  }
  std::string text = "\n--- last " + std::to_string(kTailLines) + " lines of the output of rank " +
                     std::to_string(rank) + " ---\n";
  for (const auto& line : lines) text += line + "\n";
  return text + "--- end ---";
}

fs::path make_temp_dir() {
  std::string pattern = (fs::temp_directory_path() / "kuafu-test-XXXXXX").string();
  KUAFU_CHECK(mkdtemp(pattern.data()) != nullptr, "cannot create a directory for the output of "
              "the workers from ", pattern, ": ", std::strerror(errno));
  return pattern;
}

fs::path log_path(const fs::path& dir, int rank) {
  return dir / ("rank" + std::to_string(rank) + ".log");
}
fs::path started_path(const fs::path& dir, int rank) {
  return dir / ("rank" + std::to_string(rank) + ".started");
}

// Starts the workers; throws kuafu::Error when one cannot be started.
void start_workers(dist::RankProcesses& ranks, int world, const std::string& test_name,
                   const fs::path& dir, const std::map<std::string, std::string>& extra_env) {
  dist::LaunchOptions launch;
  launch.nproc_per_node = world;
  // The store binds a free port itself and rank 0 publishes it here (no port chosen in advance that
  // another test could take first).
  launch.master_port = 0;
  launch.port_file = (dir / "master_port").string();
  for (int rank = 0; rank < world; ++rank) {
    dist::ProcessSpec spec;
    // /proc/self/exe is this very binary even if the file has since been rebuilt.
    spec.argv = {"/proc/self/exe", "--gtest_filter=" + test_name, "--gtest_also_run_disabled_tests"};
    spec.env = dist::torchrun_env(launch, rank);
    if (std::getenv("OMP_NUM_THREADS") == nullptr) {
      spec.env["OMP_NUM_THREADS"] = std::to_string(dist::omp_threads_per_rank(world));
    }
    spec.env[kWorkerVar] = "1";
    spec.env[kStartedVar] = started_path(dir, rank).string();
    // The ranks share the CPU over Gloo, as on CI, also on a GPU machine (NCCL would need a GPU per rank);
    // a test of the NCCL path passes the GPUs it wants in extra_env.
    spec.env["CUDA_VISIBLE_DEVICES"] = "";
    for (const auto& [name, value] : extra_env) spec.env[name] = value;
    // Workers must not overwrite the parent's XML report or run another shard's tests.
    spec.unset_env = {"GTEST_OUTPUT", "GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS",
                      "GTEST_SHARD_STATUS_FILE", "TORCHELASTIC_USE_AGENT_STORE"};
    spec.output_path = log_path(dir, rank).string();
    ranks.start(rank, spec);
  }
}

}  // namespace

bool is_worker() {
  const char* flag = std::getenv(kWorkerVar);
  const bool worker = flag != nullptr && std::string(flag) == "1";
  if (worker) {
    if (const char* started = std::getenv(kStartedVar)) std::ofstream{started};
  }
  return worker;
}

std::filesystem::path shared_test_dir(const std::string& name) {
  const int owner = is_worker() ? ::getppid() : ::getpid();
  return std::filesystem::temp_directory_path() / ("kuafu_" + name + "_" + std::to_string(owner));
}

int worker_rank() { return dist::detect_launch_env().rank; }
int worker_world_size() { return dist::detect_launch_env().world_size; }

void run_test_on_ranks(int world, int timeout_s, const std::map<std::string, std::string>& extra_env) {
  if (is_worker()) {
    ADD_FAILURE() << "run_test_on_ranks was called inside a worker; call it only when "
                     "!kuafu::testing::is_worker()";
    return;
  }
  ASSERT_GE(world, 1) << "run_test_on_ranks needs at least one rank";
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  ASSERT_NE(info, nullptr) << "run_test_on_ranks must be called from inside a test";
  const std::string test_name = std::string(info->test_suite_name()) + "." + info->name();

  fs::path dir;
  // Removes the workers' output files on every return; failures carry the tails they need.
  struct RemoveDir {
    fs::path& dir;
    ~RemoveDir() {
      std::error_code ignored;
      if (!dir.empty()) fs::remove_all(dir, ignored);
    }
  } remove_dir{dir};
  dist::RankProcesses ranks;
  try {
    dir = make_temp_dir();
    start_workers(ranks, world, test_name, dir, extra_env);
  } catch (const Error& e) {
    ADD_FAILURE() << "cannot start the " << world << " workers of " << test_name << ": " << e.what();
    return;  // ~RankProcesses kills the workers that did start
  }

  std::string messages;  // the supervisor's account, added to every failure
  dist::SuperviseOptions options;
  options.timeout_s = timeout_s;
  options.grace_s = kGraceSeconds;
  options.log = [&](const std::string& message) { messages += "\n  " + message; };
  const dist::SuperviseResult result = ranks.supervise(options);

  bool failed = false;
  if (result.timed_out) {
    failed = true;
    std::string message = test_name + ": timed out after " + std::to_string(timeout_s) +
                          " s; ranks still running: ";
    for (int rank : result.running_at_timeout) {
      message += (rank == result.running_at_timeout.front() ? "" : ", ") + std::to_string(rank);
    }
    for (int rank : result.running_at_timeout) message += output_tail(log_path(dir, rank), rank);
    ADD_FAILURE() << message << "\nsupervisor:" << messages;
  }
  for (const auto& exit : result.exits) {
    if (exit.ok() || exit.stopped) continue;
    failed = true;
    ADD_FAILURE() << test_name << ": worker " << dist::describe(exit)
                  << output_tail(log_path(dir, exit.rank), exit.rank) << "\nsupervisor:" << messages;
  }
  if (failed) return;

  std::vector<int> skipped;
  for (int rank = 0; rank < world; ++rank) {
    if (!fs::exists(started_path(dir, rank))) {
      ADD_FAILURE() << test_name << ": worker rank " << rank << " exited 0 without reaching the "
                    << "test; it must begin with `if (!kuafu::testing::is_worker())`"
                    << output_tail(log_path(dir, rank), rank);
      return;
    }
    if (read_file(log_path(dir, rank)).find("[  SKIPPED ] " + test_name) != std::string::npos) {
      skipped.push_back(rank);
    }
  }
  if (!skipped.empty()) {
    GTEST_SKIP() << "skipped by " << skipped.size() << " of " << world << " workers"
                 << output_tail(log_path(dir, skipped[0]), skipped[0]);
  }
}

}  // namespace kuafu::testing

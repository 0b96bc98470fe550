// Tests of kuafu-run (the real binary, with /bin/sh scripts as ranks), of the process code behind
// it, and of the multi-process test harness that reuses that code.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/dist/launcher.h"
#include "core/util/error.h"
#include "tests/support/multiprocess.h"
#include "tests/support/test_util.h"

namespace kuafu::dist {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Vars = std::map<std::string, std::string>;
using testing::error_message;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A fresh directory per test; the ranks write their files into it (OUT_DIR).
class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kuafu-launcher-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  struct Run {
    int status = -1;  // exit code of kuafu-run, 128 + signal if it was killed
    std::string output;
    double seconds = 0;
  };

  // Starts kuafu-run with `args` (OUT_DIR set, OMP_NUM_THREADS unset unless in `env`).
  void start(RankProcesses& processes, const std::vector<std::string>& args, Vars env = {}) {
    ProcessSpec spec;
    spec.argv = {KUAFU_RUN_PATH};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.env = env;
    spec.env["OUT_DIR"] = dir_.string();
    if (!env.count("OMP_NUM_THREADS")) spec.unset_env = {"OMP_NUM_THREADS"};
    spec.output_path = (dir_ / "kuafu-run.out").string();
    started_ = Clock::now();
    processes.start(0, spec);
  }

  // Waits for kuafu-run (killing it after 30 s) and collects its exit and output.
  Run finish(RankProcesses& processes) {
    SuperviseOptions options;
    options.timeout_s = 30;
    options.grace_s = 1;
    SuperviseResult result = processes.supervise(options);
    Run run;
    run.seconds = std::chrono::duration<double>(Clock::now() - started_).count();
    run.output = read_file(dir_ / "kuafu-run.out");
    EXPECT_FALSE(result.timed_out) << "kuafu-run hung; output:\n" << run.output;
    run.status = result.exits.at(0).exit_status();
    return run;
  }

  Run run(const std::vector<std::string>& args, Vars env = {}) {
    RankProcesses processes;
    start(processes, args, env);
    return finish(processes);
  }

  // Waits until every file exists, so that a signal reaches ranks that are ready for it.
  void wait_for_files(const std::vector<std::string>& names) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    for (const auto& name : names) {
      while (!fs::exists(dir_ / name)) {
        ASSERT_LT(Clock::now(), deadline) << name << " did not appear";
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

  fs::path dir_;
  Clock::time_point started_;
};

// Each rank writes its torchrun variables and arguments to $OUT_DIR/rank$RANK.
const char* const kWriteEnv =
    "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $NODE_RANK $MASTER_ADDR "
    "$MASTER_PORT $OMP_NUM_THREADS ${KUAFU_MASTER_PORT_FILE:-none} $*\" > \"$OUT_DIR/rank$RANK\"";

int cpus_available() {
  cpu_set_t set;
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  return CPU_COUNT(&set);
}

TEST_F(LauncherTest, AllRanksSucceed) {
  Run r = run({"--nproc-per-node", "3", "--master-port", "0", "/bin/sh", "-c", kWriteEnv, "sh",
               "--nproc-per-node", "7", "--", "x"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "");
  const int omp = std::max(1, cpus_available() / 3);
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream fields(read_file(dir_ / ("rank" + std::to_string(rank))));
    std::string env[10];
    for (auto& field : env) fields >> field;
    std::string args;
    std::getline(fields, args);
    EXPECT_EQ(env[0], std::to_string(rank));  // RANK
    EXPECT_EQ(env[1], "3");                   // WORLD_SIZE
    EXPECT_EQ(env[2], std::to_string(rank));  // LOCAL_RANK
    EXPECT_EQ(env[3], "3");                   // LOCAL_WORLD_SIZE
    EXPECT_EQ(env[4], "0");                   // GROUP_RANK
    EXPECT_EQ(env[5], "0");                   // NODE_RANK
    EXPECT_EQ(env[6], "127.0.0.1");           // MASTER_ADDR
    // MASTER_PORT 0: rank 0's store binds a free port and publishes it in one file for every rank.
    EXPECT_EQ(env[7], "0");
    EXPECT_NE(env[9], "none");                // KUAFU_MASTER_PORT_FILE
    if (rank > 0) {
      EXPECT_EQ(env[9], port);
    }
    port = env[9];
    EXPECT_EQ(env[8], std::to_string(omp));   // OMP_NUM_THREADS
    EXPECT_EQ(args, " --nproc-per-node 7 -- x");  // the program's own flags pass through
  }
  EXPECT_FALSE(fs::exists(dir_ / "rank3"));
}

TEST_F(LauncherTest, SecondNodeNumbersItsRanksAfterTheFirst) {
  Run r = run({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr",
               "10.9.8.7", "--master-port=29611", "--", "/bin/sh", "-c", kWriteEnv},
              {{"OMP_NUM_THREADS", "7"}});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_file(dir_ / "rank2"), "2 4 0 2 1 1 10.9.8.7 29611 7 none \n");
  EXPECT_EQ(read_file(dir_ / "rank3"), "3 4 1 2 1 1 10.9.8.7 29611 7 none \n");
  EXPECT_FALSE(fs::exists(dir_ / "rank0"));
}

TEST_F(LauncherTest, FailingRankStopsTheOthers) {
  Run r = run({"--nproc-per-node", "3", "/bin/sh", "-c",
               "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60"});
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_LT(r.seconds, 5) << "the sleeping ranks were not stopped by SIGTERM";
  EXPECT_TRUE(contains(r.output, "kuafu-run: rank 1 (pid ")) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with code 3")) << r.output;
  EXPECT_TRUE(contains(r.output, "stopping the other ranks (0, 2)")) << r.output;
  EXPECT_FALSE(contains(r.output, "rank 0 (pid")) << r.output;  // stopped ranks are no failures
}

TEST_F(LauncherTest, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  RankProcesses processes;
  start(processes, {"--nproc-per-node", "2", "--timeout-grace", "1", "/bin/sh", "-c",
                    "trap '' TERM; touch \"$OUT_DIR/ready$RANK\"; "
                    "if [ \"$RANK\" = 1 ]; then while [ ! -e \"$OUT_DIR/go\" ]; do sleep 0.01; done; "
                    "exit 4; fi; sleep 60"});
  wait_for_files({"ready0", "ready1"});
  std::ofstream(dir_ / "go").close();
  const auto failed_at = Clock::now();
  Run r = finish(processes);
  const double after_failure = std::chrono::duration<double>(Clock::now() - failed_at).count();
  EXPECT_EQ(r.status, 4) << r.output;
  EXPECT_GE(after_failure, 0.9) << "killed before the grace period was over";
  EXPECT_LT(after_failure, 5);
  EXPECT_TRUE(contains(r.output, "ranks 0 did not stop within")) << r.output;
  EXPECT_TRUE(contains(r.output, "SIGKILL")) << r.output;
}

TEST_F(LauncherTest, SignalDeathIsReported) {
  Run r = run({"--nproc-per-node", "2", "/bin/sh", "-c",
               "ulimit -c 0; if [ \"$RANK\" = 0 ]; then kill -SEGV $$; fi; sleep 60"});
  EXPECT_EQ(r.status, 128 + SIGSEGV) << r.output;
  EXPECT_LT(r.seconds, 5);
  EXPECT_TRUE(contains(r.output, "kuafu-run: rank 0 (pid ")) << r.output;
  EXPECT_TRUE(contains(r.output, "was killed by signal SIGSEGV")) << r.output;
}

TEST_F(LauncherTest, ProgramNotFound) {
  Run r = run({"--nproc-per-node", "2", "/nonexistent/kuafu-program"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "cannot start '/nonexistent/kuafu-program': No such file"))
      << r.output;
  r = run({"kuafu-no-such-program", "--flag"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "'kuafu-no-such-program'")) << r.output;
  EXPECT_TRUE(contains(r.output, "not found in PATH")) << r.output;
  std::ofstream(dir_ / "not-executable") << "#!/bin/sh\n";
  r = run({(dir_ / "not-executable").string()});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "Permission denied")) << r.output;
}

TEST_F(LauncherTest, CommandLineErrorsPrintUsage) {
  Run r = run({"--bogus", "1", "/bin/true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "--bogus")) << r.output;
  EXPECT_TRUE(contains(r.output, "usage: kuafu-run")) << r.output;
  r = run({"--nproc-per-node", "two", "/bin/true"});
  EXPECT_EQ(r.status, 2) << r.output;
  r = run({"--nproc-per-node", "2"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "no PROGRAM")) << r.output;
  r = run({"--help"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "--nproc-per-node")) << r.output;
  EXPECT_TRUE(contains(r.output, "--timeout-grace")) << r.output;
  r = run({"--nproc-per-node", "0", "/bin/true"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--nproc-per-node must be at least 1")) << r.output;
  r = run({"--nnodes", "2", "--node-rank", "1", "--master-port", "0", "/bin/true"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--master-port 0")) << r.output;
}

// Before: a TMPDIR that is not a folder aborted kuafu-run with an uncaught filesystem_error (core dump).
TEST_F(LauncherTest, AnUnusableTmpdirForThePortFileIsAnError) {
  std::ofstream(dir_ / "a-file") << "x";
  const Run r = run({"--master-port", "0", "/bin/true"}, {{"TMPDIR", (dir_ / "a-file").string()}});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "kuafu-run: error: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "TMPDIR")) << r.output;
  EXPECT_TRUE(contains(r.output, (dir_ / "a-file").string())) << r.output;
}

TEST_F(LauncherTest, ForwardsSigtermAndWaitsForTheRanks) {
  RankProcesses processes;
  start(processes, {"--nproc-per-node", "2", "/bin/sh", "-c",
                    "trap 'echo saved > \"$OUT_DIR/saved$RANK\"; exit 0' TERM; "
                    "touch \"$OUT_DIR/ready$RANK\"; while :; do sleep 0.05; done"});
  wait_for_files({"ready0", "ready1"});
  processes.signal_all(SIGTERM);  // kuafu-run's group only: the ranks have their own
  Run r = finish(processes);
  EXPECT_EQ(r.status, 128 + SIGTERM) << r.output;
  EXPECT_EQ(read_file(dir_ / "saved0"), "saved\n");  // each rank got the signal and finished
  EXPECT_EQ(read_file(dir_ / "saved1"), "saved\n");
  EXPECT_TRUE(contains(r.output, "received SIGTERM")) << r.output;
}

TEST_F(LauncherTest, SecondSigintKillsTheRanks) {
  RankProcesses processes;
  start(processes, {"--nproc-per-node", "2", "/bin/sh", "-c",
                    "trap '' INT; touch \"$OUT_DIR/ready$RANK\"; sleep 60"});
  wait_for_files({"ready0", "ready1"});
  processes.signal_all(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  processes.signal_all(SIGINT);
  Run r = finish(processes);
  EXPECT_EQ(r.status, 128 + SIGINT) << r.output;
  EXPECT_LT(r.seconds, 5);
  EXPECT_TRUE(contains(r.output, "received SIGINT, passing it to the ranks")) << r.output;
  EXPECT_TRUE(contains(r.output, "received SIGINT again, killing the ranks")) << r.output;
}

TEST_F(LauncherTest, TorchrunEnvironment) {
  LaunchOptions options;
  options.nproc_per_node = 4;
  options.nnodes = 2;
  options.node_rank = 1;
  options.master_addr = "head";
  options.master_port = 1234;
  EXPECT_EQ(torchrun_env(options, 2),
            (Vars{{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"},
                  {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}, {"NODE_RANK", "1"},
                  {"MASTER_ADDR", "head"}, {"MASTER_PORT", "1234"}}));
}

TEST_F(LauncherTest, RunRanksRejectsBadOptionsBeforeStartingAnything) {
  LaunchOptions options;
  options.nproc_per_node = 0;
  EXPECT_THROW(run_ranks(options, {"/bin/true"}), Error);
  options = LaunchOptions{};
  options.nnodes = 2;
  options.node_rank = 2;
  EXPECT_THROW(run_ranks(options, {"/bin/true"}), Error);
  options = LaunchOptions{};
  options.master_port = 70000;
  EXPECT_THROW(run_ranks(options, {"/bin/true"}), Error);
  options = LaunchOptions{};
  options.timeout_grace_s = -1;
  EXPECT_THROW(run_ranks(options, {"/bin/true"}), Error);
  EXPECT_THROW(run_ranks(LaunchOptions{}, {}), Error);
  // Before: NaN was "negative", and a world larger than an int overflowed into a negative WORLD_SIZE
  // that the ranks were started with.
  options = LaunchOptions{};
  options.timeout_grace_s = std::nan("");
  EXPECT_TRUE(contains(error_message([&] { run_ranks(options, {"/bin/true"}); }), "--timeout-grace must be a number"));
  options = LaunchOptions{};
  options.nnodes = 2000000000;
  options.nproc_per_node = 2;
  options.node_rank = 1;
  const std::string message = error_message([&] { run_ranks(options, {"/bin/true"}); });
  EXPECT_TRUE(contains(message, "--nnodes 2000000000 x --nproc-per-node 2")) << message;
}

TEST_F(LauncherTest, FindFreePortCanBeBound) {
  const int port = find_free_port();
  ASSERT_GT(port, 0);
  ASSERT_LT(port, 65536);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0) << port;
  close(fd);
}

TEST_F(LauncherTest, DescribesExits) {
  RankExit exit;
  exit.rank = 1;
  exit.pid = 42;
  exit.code = 3;
  EXPECT_EQ(describe(exit), "rank 1 (pid 42) exited with code 3");
  EXPECT_EQ(exit.exit_status(), 3);
  exit.signaled = true;
  exit.code = SIGSEGV;
  EXPECT_EQ(describe(exit), "rank 1 (pid 42) was killed by signal SIGSEGV");
  EXPECT_EQ(exit.exit_status(), 128 + SIGSEGV);
  EXPECT_EQ(signal_name(50), "signal 50");
}

}  // namespace
}  // namespace kuafu::dist

namespace kuafu::testing {
namespace {

// The failures (and skips) that run_test_on_ranks reports, captured instead of affecting this test.
std::vector<::testing::TestPartResult> capture_run(int world, int timeout_s) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    run_test_on_ranks(world, timeout_s);
  }
  std::vector<::testing::TestPartResult> parts;
  for (int i = 0; i < results.size(); ++i) parts.push_back(results.GetTestPartResult(i));
  return parts;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(MultiprocessTest, TwoWorkersSeeTheTorchrunEnvironment) {
  namespace fs = std::filesystem;
  if (!is_worker()) {
    std::string dir = (fs::temp_directory_path() / "kuafu-mp-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    run_test_on_ranks(2, 30, {{"KUAFU_TEST_DIR", dir}});
    EXPECT_TRUE(fs::exists(fs::path(dir) / "rank0"));  // both ranks ran, with different ranks
    EXPECT_TRUE(fs::exists(fs::path(dir) / "rank1"));
    fs::remove_all(dir);
    return;
  }
  const int rank = worker_rank();
  EXPECT_EQ(worker_world_size(), 2);
  EXPECT_TRUE(rank == 0 || rank == 1) << rank;
  EXPECT_EQ(std::string(std::getenv("LOCAL_RANK")), std::to_string(rank));
  EXPECT_EQ(std::string(std::getenv("LOCAL_WORLD_SIZE")), "2");
  EXPECT_EQ(std::string(std::getenv("MASTER_ADDR")), "127.0.0.1");
  // Port 0: the store binds a free port and rank 0 publishes it in this file (no port race).
  EXPECT_EQ(std::string(std::getenv("MASTER_PORT")), "0");
  EXPECT_NE(std::getenv("KUAFU_MASTER_PORT_FILE"), nullptr);
  std::ofstream(std::string(std::getenv("KUAFU_TEST_DIR")) + "/rank" + std::to_string(rank)).close();
}

TEST(MultiprocessTest, ReportsTheFailingRankWithItsOutput) {
  if (!is_worker()) {
    auto results = capture_run(2, 30);
    ASSERT_EQ(results.size(), 1u);
    const std::string message = results[0].message();
    EXPECT_TRUE(results[0].nonfatally_failed());
    EXPECT_TRUE(contains(message, "worker rank 1 (pid ")) << message;
    EXPECT_TRUE(contains(message, "exited with code 1")) << message;
    EXPECT_TRUE(contains(message, "deliberate failure of rank 1")) << message;  // the output tail
    return;
  }
  if (worker_rank() == 1) ADD_FAILURE() << "deliberate failure of rank 1";
}

TEST(MultiprocessTest, ReportsATimeoutNamingTheRanksStillRunning) {
  if (!is_worker()) {
    const auto started = std::chrono::steady_clock::now();
    auto results = capture_run(2, 1);
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
    ASSERT_EQ(results.size(), 1u);
    const std::string message = results[0].message();
    EXPECT_TRUE(contains(message, "timed out after 1 s; ranks still running: 0\n")) << message;
    EXPECT_TRUE(contains(message, "rank 0 sleeping")) << message;
    return;
  }
  if (worker_rank() == 0) {
    std::cout << "rank 0 sleeping" << std::endl;
    std::this_thread::sleep_for(std::chrono::seconds(30));
  }
}

TEST(MultiprocessTest, SkipsWhenTheWorkersSkip) {
  if (!is_worker()) {
    auto results = capture_run(2, 30);
    ASSERT_EQ(results.size(), 1u);
    EXPECT_TRUE(results[0].skipped());
    EXPECT_TRUE(contains(results[0].message(), "no accelerator here"));
    return;
  }
  GTEST_SKIP() << "no accelerator here";
}

TEST(MultiprocessTest, FailsWhenTheWorkersNeverReachTheTest) {
  if (std::getenv("KUAFU_TEST_WORKER") != nullptr) return;  // a worker that skips is_worker()
  auto results = capture_run(1, 30);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(contains(results[0].message(), "without reaching the test"));
}

}  // namespace
}  // namespace kuafu::testing

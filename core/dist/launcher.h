// kuafu-run's process management: starts the ranks of a program with torchrun's environment and
// supervises them (the first failure stops the rest). The multi-process test harness reuses it.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kuafu::dist {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;          // 0: pick a free port on this host (single node only)
  double timeout_grace_s = 10.0;    // SIGTERM to SIGKILL once a rank has failed
  // With master_port 0 (single node): the file through which rank 0 publishes the port its store bound.
  std::string port_file;
};

// Starts nproc_per_node copies of `argv` and supervises them like kuafu-run: returns 0 when all
// succeed, else the first failed rank's exit code (128 + signal when it was killed), or 128 + the
// signal when SIGINT/SIGTERM to this process were forwarded to the ranks. Messages go to stderr.
// Throws kuafu::Error for invalid options or when the program cannot be started.
int run_ranks(const LaunchOptions& options, const std::vector<std::string>& argv);

// The torchrun variables for one local rank: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT, and KUAFU_MASTER_PORT_FILE when the port is 0.
std::map<std::string, std::string> torchrun_env(const LaunchOptions& options, int local_rank);

// OpenMP threads per rank so that the ranks share the CPUs this process may use: max(1, cpus / n).
int omp_threads_per_rank(int ranks_on_node);

// A TCP port that was free a moment ago: binds port 0 on 127.0.0.1 and reads it back. Another process
// may take it before it is used: rendezvous uses port 0 and a port file instead (LaunchEnv::port_file).
int find_free_port();

// A fresh temporary folder for a single-node run's port file (see LaunchEnv::port_file); the caller
// removes it. Throws kuafu::Error when none can be made.
std::string make_port_file_dir();

// "SIGSEGV" for SIGSEGV, "signal 42" for ones without a common name.
std::string signal_name(int signal);

// How one rank ended.
struct RankExit {
  int rank = 0;
  int pid = 0;
  bool signaled = false;  // killed by signal `code` rather than exiting with `code`
  int code = 0;
  bool stopped = false;   // still running when the supervisor began stopping the ranks

  bool ok() const { return !signaled && code == 0; }
  int exit_status() const { return signaled ? 128 + code : code; }  // as a shell reports it
};

// "rank 1 (pid 42) exited with code 3" or "rank 0 (pid 41) was killed by signal SIGSEGV".
std::string describe(const RankExit& exit);

struct ProcessSpec {
  std::vector<std::string> argv;            // argv[0] is looked up in PATH like execvp does
  std::map<std::string, std::string> env;   // set on top of this process's environment
  std::vector<std::string> unset_env;       // removed from it
  std::string output_path;                  // stdout and stderr go to this file when not empty
};

struct SuperviseOptions {
  double grace_s = 10.0;         // SIGTERM to SIGKILL when stopping the ranks
  double timeout_s = 0.0;        // stop the ranks after this long; 0: no limit
  bool forward_signals = false;  // pass SIGINT/SIGTERM sent to this process on to the ranks
  std::function<void(const std::string&)> log;  // progress messages; empty: none
};

struct SuperviseResult {
  int exit_code = 0;                    // 0, the first failure's exit_status(), 124 on timeout,
                                        // or 128 + the forwarded signal
  std::optional<RankExit> first_failure;
  bool timed_out = false;
  std::vector<int> running_at_timeout;  // ranks that had not finished when time ran out
  int forwarded_signal = 0;             // 0 when no signal was forwarded
  std::vector<RankExit> exits;          // one per rank, in start order
};

// Processes started and supervised together. Each runs in its own process group so that signals
// reach whatever it starts too, and dies with this process (Linux). The destructor kills and
// reaps whatever is still running.
class RankProcesses {
 public:
  RankProcesses() = default;
  ~RankProcesses();
  RankProcesses(const RankProcesses&) = delete;
  RankProcesses& operator=(const RankProcesses&) = delete;

  // Starts one process and returns its pid once it has exec'd. Throws kuafu::Error naming the
  // program when it cannot be started (not found, not executable, output file not writable).
  int start(int rank, const ProcessSpec& spec);

  // Waits until all have exited. The first one to fail (non-zero exit or signal), a timeout, or
  // a forwarded signal makes it stop the rest: SIGTERM, then SIGKILL after the grace period.
  SuperviseResult supervise(const SuperviseOptions& options);

  // Sends `signal` to the process group of every rank still running.
  void signal_all(int signal);

 private:
  struct Child {
    RankExit exit;
    bool running = true;
  };
  std::vector<Child> children_;
};

}  // namespace kuafu::dist

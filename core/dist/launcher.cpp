#include "core/dist/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>
#include <thread>

#include "core/util/error.h"

extern char** environ;

namespace kuafu::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Written by the signal handler while supervise() forwards signals, read by its polling loop.
volatile std::sig_atomic_t g_signal_count = 0;
volatile std::sig_atomic_t g_last_signal = 0;

void on_signal(int signal) {
  g_last_signal = signal;
  g_signal_count = g_signal_count + 1;
}

// Catches SIGINT and SIGTERM for its lifetime, then restores the previous handlers.
class CaughtSignals {
 public:
  explicit CaughtSignals(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    g_signal_count = 0;
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~CaughtSignals() {
    if (!enabled_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  CaughtSignals(const CaughtSignals&) = delete;
  CaughtSignals& operator=(const CaughtSignals&) = delete;

 private:
  bool enabled_;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// NAME=value entries for a child: this process's environment with the spec's changes.
std::vector<std::string> child_environment(const ProcessSpec& spec) {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string text = *entry;
    auto eq = text.find('=');
    if (eq != std::string::npos) vars.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  for (const auto& name : spec.unset_env) vars.erase(name);
  for (const auto& [name, value] : spec.env) vars[name] = value;
  std::vector<std::string> entries;
  for (const auto& [name, value] : vars) entries.push_back(name + "=" + value);
  return entries;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  for (auto& s : strings) result.push_back(s.data());
  result.push_back(nullptr);
  return result;
}

// Runs in the forked child. Only async-signal-safe calls until exec: the parent may have threads.
[[noreturn]] void exec_child(char* const argv[], char** envp, int output_fd, int error_fd,
                             pid_t parent) {
  setpgid(0, 0);  // own group: signals to the rank reach what it starts too
#ifdef __linux__
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // do not outlive the launcher if it is killed
  if (getppid() != parent) _exit(127);  // it died before prctl took effect
#else
  (void)parent;
#endif
  if (output_fd >= 0) {
    dup2(output_fd, STDOUT_FILENO);
    dup2(output_fd, STDERR_FILENO);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);  // hosts such as Python ignore it; programs expect the default
  environ = envp;
  execvp(argv[0], argv);
  int error = errno;
  ssize_t ignored = write(error_fd, &error, sizeof error);  // tells start() why exec failed
  (void)ignored;
  _exit(127);
}

pid_t wait_retrying(pid_t pid, int* status, int flags) {
  pid_t result;
  do {
    result = waitpid(pid, status, flags);
  } while (result < 0 && errno == EINTR);
  return result;
}

// 10 -> "10", 0.5 -> "0.5": for messages.
std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << seconds << " s";
  return out.str();
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

}  // namespace

std::string signal_name(int signal) {
  static const std::map<int, const char*> kNames = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"}};
  auto found = kNames.find(signal);
  return found != kNames.end() ? found->second : "signal " + std::to_string(signal);
}

std::string describe(const RankExit& exit) {
  std::ostringstream out;
  out << "rank " << exit.rank << " (pid " << exit.pid << ")";
  if (exit.signaled) {
    out << " was killed by signal " << signal_name(exit.code);
  } else {
    out << " exited with code " << exit.code;
  }
  return out.str();
}

RankProcesses::~RankProcesses() {
  for (auto& child : children_) {
    if (!child.running) continue;
    kill(-child.exit.pid, SIGKILL);
    kill(child.exit.pid, SIGKILL);
    int status = 0;
    wait_retrying(child.exit.pid, &status, 0);
  }
}

int RankProcesses::start(int rank, const ProcessSpec& spec) {
  KUAFU_CHECK(!spec.argv.empty() && !spec.argv[0].empty(), "no program given to start");
  std::vector<std::string> args = spec.argv;
  std::vector<std::string> env = child_environment(spec);
  std::vector<char*> argv_ptrs = pointers(args);
  std::vector<char*> env_ptrs = pointers(env);

  int output_fd = -1;
  if (!spec.output_path.empty()) {
    output_fd = open(spec.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    KUAFU_CHECK(output_fd >= 0, "cannot open '", spec.output_path, "' for the output of rank ",
                rank, ": ", std::strerror(errno));
  }
  // A close-on-exec pipe: it closes silently when exec succeeds, or carries exec's errno.
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) {
    int error = errno;
    if (output_fd >= 0) close(output_fd);
    fail(std::string("cannot create a pipe: ") + std::strerror(error));
  }
  // With SIGCHLD ignored the kernel would reap the ranks and their exit codes would be lost.
  struct sigaction chld {};
  if (sigaction(SIGCHLD, nullptr, &chld) == 0 && chld.sa_handler == SIG_IGN) {
    signal(SIGCHLD, SIG_DFL);
  }

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) exec_child(argv_ptrs.data(), env_ptrs.data(), output_fd, error_pipe[1], parent);
  const int fork_errno = errno;
  close(error_pipe[1]);
  if (output_fd >= 0) close(output_fd);
  if (pid < 0) {
    close(error_pipe[0]);
    fail(std::string("cannot fork rank ") + std::to_string(rank) + ": " + std::strerror(fork_errno));
  }

  int exec_errno = 0;
  ssize_t got;
  do {
    got = read(error_pipe[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  close(error_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    int status = 0;
    wait_retrying(pid, &status, 0);
    std::string message = "cannot start '" + spec.argv[0] + "': " + std::strerror(exec_errno);
    if (exec_errno == ENOENT && spec.argv[0].find('/') == std::string::npos) {
      message += " (not found in PATH)";
    }
    fail(message);
  }

  Child child;
  child.exit.rank = rank;
  child.exit.pid = pid;
  children_.push_back(child);
  return pid;
}

void RankProcesses::signal_all(int signal) {
  for (const auto& child : children_) {
    if (!child.running) continue;
    // The group, so that a shell's children get it too; the pid alone if it left its group.
    if (kill(-child.exit.pid, signal) != 0) kill(child.exit.pid, signal);
  }
}

SuperviseResult RankProcesses::supervise(const SuperviseOptions& options) {
  CaughtSignals caught(options.forward_signals);
  auto log = [&](const std::string& message) {
    if (options.log) options.log(message);
  };
  auto running_ranks = [&] {
    std::vector<int> ranks;
    for (const auto& child : children_) {
      if (child.running) ranks.push_back(child.exit.rank);
    }
    return ranks;
  };

  SuperviseResult result;
  const auto started = Clock::now();
  const auto grace = std::chrono::duration<double>(options.grace_s);
  constexpr Clock::time_point kNever = Clock::time_point::max();
  Clock::time_point kill_at = kNever;  // when SIGTERM turns into SIGKILL
  bool stopping = false;
  int signals_seen = 0;

  auto stop = [&](int signal, bool then_kill) {
    stopping = true;
    for (auto& child : children_) child.exit.stopped = child.running;
    signal_all(signal);
    if (then_kill) kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace);
  };

  // Polls rather than waiting for SIGCHLD: in a multi-threaded host another thread may get it.
  while (!running_ranks().empty()) {
    std::vector<Child*> exited;
    for (auto& child : children_) {
      if (!child.running) continue;
      int status = 0;
      pid_t got = waitpid(child.exit.pid, &status, WNOHANG);
      if (got == child.exit.pid) {
        child.exit.signaled = WIFSIGNALED(status);
        child.exit.code = child.exit.signaled ? WTERMSIG(status) : WEXITSTATUS(status);
      } else if (got < 0 && errno == ECHILD) {
        child.exit.code = 255;  // reaped by someone else: the status is lost
      } else {
        continue;
      }
      child.running = false;
      exited.push_back(&child);
    }
    for (Child* child : exited) {  // ranks that ended in the same poll all count as failures
      if (child->exit.ok() || child->exit.stopped) continue;
      log(describe(child->exit));
      if (!result.first_failure) result.first_failure = child->exit;
    }
    if (result.first_failure && !stopping) {
      auto others = running_ranks();
      if (!others.empty()) {
        log("stopping the other ranks (" + join_ranks(others) + ") with SIGTERM");
        stop(SIGTERM, true);
      }
    }

    if (options.forward_signals && g_signal_count > signals_seen) {
      ++signals_seen;
      const int signal = g_last_signal;
      if (!stopping) {
        result.forwarded_signal = signal;
        log("received " + signal_name(signal) + ", passing it to the ranks and waiting for them "
            "(send it again to kill them)");
        stop(signal, false);
      } else {
        log("received " + signal_name(signal) +
            (result.forwarded_signal != 0 ? " again" : " while the ranks were stopping") +
            ", killing the ranks");
        signal_all(SIGKILL);
      }
    }

    const auto now = Clock::now();
    if (options.timeout_s > 0 && !stopping &&
        now - started >= std::chrono::duration<double>(options.timeout_s)) {
      result.timed_out = true;
      result.running_at_timeout = running_ranks();
      log("timed out after " + seconds_text(options.timeout_s) + "; ranks still running: " +
          join_ranks(result.running_at_timeout));
      stop(SIGTERM, true);
    }
    if (now >= kill_at) {
      auto left = running_ranks();
      if (!left.empty()) {
        log("ranks " + join_ranks(left) + " did not stop within " + seconds_text(options.grace_s) +
            " of SIGTERM, sending SIGKILL");
        signal_all(SIGKILL);
      }
      kill_at = kNever;
    }
    if (!running_ranks().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  for (const auto& child : children_) result.exits.push_back(child.exit);
  if (result.forwarded_signal != 0) {
    result.exit_code = 128 + result.forwarded_signal;
  } else if (result.first_failure) {
    result.exit_code = result.first_failure->exit_status();
  } else if (result.timed_out) {
    result.exit_code = 124;
  }
  return result;
}

std::map<std::string, std::string> torchrun_env(const LaunchOptions& options, int local_rank) {
  const int world_size = options.nnodes * options.nproc_per_node;
  std::map<std::string, std::string> env{
      {"RANK", std::to_string(options.node_rank * options.nproc_per_node + local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"NODE_RANK", std::to_string(options.node_rank)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
  };
  if (!options.port_file.empty()) env["KUAFU_MASTER_PORT_FILE"] = options.port_file;
  return env;
}

int omp_threads_per_rank(int ranks_on_node) {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = CPU_COUNT(&set);  // honours taskset
#endif
  return std::max(1, cpus / std::max(1, ranks_on_node));
}

int find_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  KUAFU_CHECK(fd >= 0, "cannot create a socket to find a free port: ", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;  // the kernel picks a free one
  socklen_t length = sizeof address;
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  int error = errno;
  close(fd);
  KUAFU_CHECK(ok, "cannot find a free TCP port on 127.0.0.1: ", std::strerror(error));
  return ntohs(address.sin_port);
}

std::string make_port_file_dir() {
  std::error_code error;
  const std::filesystem::path temp = std::filesystem::temp_directory_path(error);
  if (error) {
    const char* tmpdir = std::getenv("TMPDIR");
    fail(detail::concat("--master-port 0 needs a temporary folder for the rendezvous port file, but ",
                        tmpdir ? "TMPDIR=" + std::string(tmpdir) : std::string("/tmp"), " is not usable (",
                        error.message(), "); set TMPDIR to a writable folder"));
  }
  std::string pattern = (temp / "kuafu-run-XXXXXX").string();
  KUAFU_CHECK(mkdtemp(pattern.data()) != nullptr, "cannot create a folder for the rendezvous port file from ",
              pattern, ": ", std::strerror(errno));
  return pattern;
}

int run_ranks(const LaunchOptions& options, const std::vector<std::string>& argv) {
  KUAFU_CHECK(!argv.empty(), "no program given to run");
  KUAFU_CHECK(options.nproc_per_node >= 1, "--nproc-per-node must be at least 1, not ",
              options.nproc_per_node);
  KUAFU_CHECK(options.nnodes >= 1, "--nnodes must be at least 1, not ", options.nnodes);
  KUAFU_CHECK(int64_t{options.nnodes} * options.nproc_per_node <= std::numeric_limits<int>::max(), "--nnodes ",
              options.nnodes, " x --nproc-per-node ", options.nproc_per_node, " ranks do not fit WORLD_SIZE (at most ",
              std::numeric_limits<int>::max(), ")");
  KUAFU_CHECK(options.node_rank >= 0 && options.node_rank < options.nnodes, "--node-rank ",
              options.node_rank, " must be between 0 and --nnodes - 1 = ", options.nnodes - 1);
  KUAFU_CHECK(options.master_port >= 0 && options.master_port <= 65535, "--master-port ",
              options.master_port, " is not a TCP port (0 to 65535)");
  KUAFU_CHECK(options.master_port != 0 || options.nnodes == 1,
              "--master-port 0 picks a free port on this host, which the other nodes cannot "
              "know; give the same fixed port on every node when --nnodes > 1");
  KUAFU_CHECK(!options.master_addr.empty(), "--master-addr must not be empty");
  KUAFU_CHECK(options.timeout_grace_s >= 0, "--timeout-grace must be a number of seconds >= 0, not ",
              options.timeout_grace_s);

  LaunchOptions resolved = options;
  std::string port_dir;  // master port 0: the store binds a free one and publishes it in a file here
  if (resolved.master_port == 0) {
    port_dir = make_port_file_dir();
    resolved.port_file = port_dir + "/master_port";
  }
  struct RemovePortDir {
    const std::string& dir;
    ~RemovePortDir() {
      std::error_code ignored;
      if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
    }
  } remove_port_dir{port_dir};
  const bool set_omp = std::getenv("OMP_NUM_THREADS") == nullptr;

  RankProcesses ranks;
  for (int local = 0; local < options.nproc_per_node; ++local) {
    ProcessSpec spec;
    spec.argv = argv;
    spec.env = torchrun_env(resolved, local);
    if (set_omp) spec.env["OMP_NUM_THREADS"] = std::to_string(omp_threads_per_rank(options.nproc_per_node));
    spec.unset_env = {"TORCHELASTIC_USE_AGENT_STORE"};  // no agent hosts a store here
    ranks.start(resolved.node_rank * options.nproc_per_node + local, spec);
  }
  SuperviseOptions supervise;
  supervise.grace_s = options.timeout_grace_s;
  supervise.forward_signals = true;
  supervise.log = [](const std::string& message) {
    std::cerr << "kuafu-run: " << message << std::endl;
  };
  return ranks.supervise(supervise).exit_code;
}

}  // namespace kuafu::dist

#include "apps/fastfold/subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/util/error.h"
#include "core/util/text.h"

extern char** environ;

namespace kuafu::fold {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// The last `count` lines of `text` (trailing blank space dropped), for an error message.
std::string last_lines(std::string_view text, size_t count) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  size_t start = text.size();
  for (size_t i = 0; i < count; ++i) {
    const size_t newline = start == 0 ? std::string_view::npos : text.rfind('\n', start - 1);
    if (newline == std::string_view::npos) return std::string(text);
    start = newline;
  }
  return std::string(text.substr(start + 1));
}

// Closes the file descriptors it holds when it goes, however the function that owns it ends.
struct Fds {
  int fd[2] = {-1, -1};
  ~Fds() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  void close(int i) {
    if (fd[i] >= 0) ::close(fd[i]);
    fd[i] = -1;
  }
};

}  // namespace

std::string find_program(const std::string& program) {
  if (program.empty()) return "";
  if (program.find('/') != std::string::npos) return is_executable_file(program) ? program : "";
  const char* path = std::getenv("PATH");
  if (!path) return "";
  for (const std::string& folder : text::split(path, ':')) {
    if (folder.empty()) continue;  // execvp would read it as the current folder: never wanted here
    const std::string candidate = folder + "/" + program;
    if (is_executable_file(candidate)) return candidate;
  }
  return "";
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& arg : argv) {
    if (!line.empty()) line += ' ';
    const bool plain = !arg.empty() && arg.find_first_of(" \t\n'\"\\$`*?;&|<>()") == std::string::npos;
    if (plain) {
      line += arg;
    } else {
      line += '\'';
      for (char c : arg) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
      line += '\'';
    }
  }
  return line;
}

std::string run_program(const std::vector<std::string>& argv, size_t keep_bytes) {
  KUAFU_CHECK(!argv.empty(), "run_program: no program given");
  const std::string shown = command_line(argv);
  const std::string program = find_program(argv[0]);
  const char* path = std::getenv("PATH");
  KUAFU_CHECK(!program.empty(), argv[0], " not found (PATH=", path ? path : "<unset>", ") for: ", shown,
              argv[0] == "mmseqs" ? "; install Debian's mmseqs2 (scripts/setup does)" : "");

  Fds pipe_fds;
  KUAFU_CHECK(::pipe2(pipe_fds.fd, O_CLOEXEC) == 0, "cannot create a pipe for ", shown, ": ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds.fd[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds.fd[1], STDERR_FILENO);
  std::vector<char*> args;
  std::vector<std::string> copies = argv;
  copies[0] = program;
  for (std::string& arg : copies) args.push_back(arg.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  KUAFU_CHECK(spawned == 0, "cannot start ", program, " for: ", shown, ": ", std::strerror(spawned));
  pipe_fds.close(1);  // the child holds the write end now: EOF comes when it exits

  std::string output;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(pipe_fds.fd[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
    // Keep only the tail: a verbose program may print far more than an error needs.
    if (output.size() > 2 * keep_bytes) output.erase(0, output.size() - keep_bytes);
  }
  if (output.size() > keep_bytes) output.erase(0, output.size() - keep_bytes);

  int status = 0;
  pid_t waited;
  do {
    waited = ::waitpid(pid, &status, 0);
  } while (waited < 0 && errno == EINTR);
  KUAFU_CHECK(waited == pid, "cannot wait for ", shown, ": ", std::strerror(errno));
  const std::string tail = last_lines(output, 20);
  if (WIFSIGNALED(status)) {
    fail(detail::concat(shown, "\nwas killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        "); its last output:\n", tail));
  }
  KUAFU_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, shown, "\nfailed with exit status ",
              WEXITSTATUS(status), "; its last output:\n", tail);
  return output;
}

}  // namespace kuafu::fold

#include "core/dist/launch_env.h"

#include <charconv>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "core/util/error.h"

namespace kuafu::dist {
namespace {

constexpr int kDefaultPort = 29500;

// Reads variables through the lookup; every error names the variable and the value it had.
class Vars {
 public:
  explicit Vars(const EnvLookup& env) : env_(env) {}

  std::optional<std::string> get(const std::string& name) const {
    auto value = env_(name);
    if (value && value->empty()) return std::nullopt;  // `export RANK=` means "not set"
    return value;
  }
  bool has(const std::string& name) const { return get(name).has_value(); }

  std::optional<int> get_int(const std::string& name) const {
    auto text = get(name);
    if (!text) return std::nullopt;
    int value = 0;
    const char* end = text->data() + text->size();
    auto [ptr, ec] = std::from_chars(text->data(), end, value);
    KUAFU_CHECK(ec != std::errc::result_out_of_range || ptr != end, "environment variable ", name, "='", *text,
                "' is out of range (at most ", std::numeric_limits<int>::max(), ")");
    KUAFU_CHECK(ec == std::errc() && ptr == end, "environment variable ", name, "='", *text,
                "' is not an integer");
    return value;
  }

  int require_int(const std::string& name, const std::string& why) const {
    auto value = get_int(name);
    KUAFU_CHECK(value.has_value(), "environment variable ", name, " is not set; ", why);
    return *value;
  }

 private:
  const EnvLookup& env_;
};

// The variables a launcher's values came from, so that validation errors point at them.
struct Names {
  std::string rank, world_size, local_rank, local_world_size, node_rank, port;
};

void check_in_range(const std::string& name, int value, int low, int high_exclusive,
                    const std::string& bound) {
  KUAFU_CHECK(value >= low && value < high_exclusive, "environment variable ", name, "=", value,
              " is out of range: it must be at least ", low, " and below ", bound);
}

void validate(const LaunchEnv& env, const Names& n) {
  KUAFU_CHECK(env.world_size >= 1, "environment variable ", n.world_size, "=", env.world_size,
              " must be at least 1");
  check_in_range(n.rank, env.rank, 0, env.world_size,
                 n.world_size + "=" + std::to_string(env.world_size));
  check_in_range(n.local_world_size, env.local_world_size, 1, env.world_size + 1,
                 n.world_size + "=" + std::to_string(env.world_size) + " + 1");
  check_in_range(n.local_rank, env.local_rank, 0, env.local_world_size,
                 n.local_world_size + "=" + std::to_string(env.local_world_size));
  check_in_range(n.node_rank, env.node_rank, 0, env.world_size,
                 n.world_size + "=" + std::to_string(env.world_size));
  // Port 0 means "the store picks one", which only works when the ranks can learn it from a file.
  check_in_range(n.port, env.master_port, env.port_file.empty() ? 1 : 0, 65536, "65536");
  KUAFU_CHECK(!env.master_addr.empty(), "the master address is empty");
}

bool parse_bool(const std::string& name, const std::string& text) {
  if (text == "1" || text == "True" || text == "true") return true;
  if (text == "0" || text == "False" || text == "false") return false;
  fail("environment variable " + name + "='" + text + "' is not a boolean (True or False)");
}

std::string require_master_addr(const Vars& vars, int world_size, const std::string& launcher) {
  auto addr = vars.get("MASTER_ADDR");
  if (addr) return *addr;
  // A world size below 1 is reported by validate(), naming its variable.
  KUAFU_CHECK(world_size <= 1, "environment variable MASTER_ADDR is not set but the ", launcher,
              " world has ", world_size, " processes; export MASTER_ADDR=<host of rank 0> "
              "(and MASTER_PORT) so that the ranks can meet, e.g. mpirun -x MASTER_ADDR=$(hostname)");
  return "127.0.0.1";
}

LaunchEnv from_torchrun(const Vars& vars) {
  const std::string why = "torchrun and kuafu-run set RANK and WORLD_SIZE together";
  LaunchEnv env;
  env.launcher = "torchrun";
  env.rank = vars.require_int("RANK", why);
  env.world_size = vars.require_int("WORLD_SIZE", why);
  // Hand-written environments often give only RANK and WORLD_SIZE: assume a single node then.
  env.local_rank = vars.get_int("LOCAL_RANK").value_or(env.rank);
  env.local_world_size = vars.get_int("LOCAL_WORLD_SIZE").value_or(env.world_size);
  std::string node_var = vars.has("GROUP_RANK") ? "GROUP_RANK" : "NODE_RANK";
  env.node_rank = vars.get_int(node_var).value_or(
      env.local_world_size > 0 ? env.rank / env.local_world_size : 0);
  env.master_addr = require_master_addr(vars, env.world_size, "torchrun");
  env.master_port = vars.get_int("MASTER_PORT").value_or(kDefaultPort);
  if (auto store = vars.get("TORCHELASTIC_USE_AGENT_STORE")) {
    env.use_agent_store = parse_bool("TORCHELASTIC_USE_AGENT_STORE", *store);
  }
  env.port_file = vars.get("KUAFU_MASTER_PORT_FILE").value_or("");
  validate(env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", node_var, "MASTER_PORT"});
  return env;
}

LaunchEnv from_slurm(const Vars& vars) {
  const std::string why = "start the ranks with srun (sbatch alone runs one process)";
  LaunchEnv env;
  env.launcher = "slurm";
  env.rank = vars.require_int("SLURM_PROCID", why);
  env.world_size = vars.require_int("SLURM_NTASKS", why);
  env.local_rank = vars.require_int("SLURM_LOCALID", why);
  env.node_rank = vars.require_int("SLURM_NODEID", why);

  // SLURM_NTASKS_PER_NODE exists only with --ntasks-per-node; the lists always exist under srun.
  std::string local_var = "SLURM_NTASKS_PER_NODE";
  if (vars.has(local_var)) {
    env.local_world_size = *vars.get_int(local_var);
  } else {
    local_var = vars.has("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                                                      : "SLURM_TASKS_PER_NODE";
    auto list = vars.get(local_var);
    KUAFU_CHECK(list.has_value(), "environment variable SLURM_TASKS_PER_NODE is not set; ", why);
    KUAFU_CHECK(env.node_rank >= 0, "environment variable SLURM_NODEID=", env.node_rank,
                " must not be negative");
    try {
      env.local_world_size = slurm_tasks_on_node(*list, env.node_rank);
    } catch (const Error& e) {
      fail("environment variable " + local_var + "='" + *list + "': " + e.what());
    }
  }

  if (auto addr = vars.get("MASTER_ADDR")) {
    env.master_addr = *addr;
  } else {
    std::string list_var = vars.has("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
                                                           : "SLURM_JOB_NODELIST";
    auto list = vars.get(list_var);
    KUAFU_CHECK(list || env.world_size == 1, "neither MASTER_ADDR nor SLURM_STEP_NODELIST nor "
                "SLURM_JOB_NODELIST is set, so the ranks cannot find rank 0; export MASTER_ADDR");
    if (list) {
      try {
        env.master_addr = expand_slurm_hostlist(*list, 1).at(0);
      } catch (const Error& e) {
        fail("environment variable " + list_var + "='" + *list + "': " + e.what());
      }
    }
  }
  if (auto port = vars.get_int("MASTER_PORT")) {
    env.master_port = *port;
  } else if (auto job = vars.get_int("SLURM_JOB_ID")) {
    KUAFU_CHECK(*job >= 0, "environment variable SLURM_JOB_ID=", *job, " must not be negative");
    env.master_port = kDefaultPort + *job % 1000;
  } else {
    env.master_port = kDefaultPort;
  }
  validate(env, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_var, "SLURM_NODEID",
                 "MASTER_PORT"});
  return env;
}

LaunchEnv from_openmpi(const Vars& vars) {
  const std::string why = "mpirun sets the OMPI_COMM_WORLD_* variables together";
  LaunchEnv env;
  env.launcher = "openmpi";
  env.rank = vars.require_int("OMPI_COMM_WORLD_RANK", why);
  env.world_size = vars.require_int("OMPI_COMM_WORLD_SIZE", why);
  env.local_rank = vars.require_int("OMPI_COMM_WORLD_LOCAL_RANK", why);
  env.local_world_size = vars.require_int("OMPI_COMM_WORLD_LOCAL_SIZE", why);
  env.node_rank = env.local_world_size > 0 ? env.rank / env.local_world_size : 0;
  env.master_addr = require_master_addr(vars, env.world_size, "OpenMPI");
  env.master_port = vars.get_int("MASTER_PORT").value_or(kDefaultPort);
  validate(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK", "MASTER_PORT"});
  return env;
}

LaunchEnv single(const Vars& vars) {
  LaunchEnv env;
  env.launcher = "single";
  if (auto addr = vars.get("MASTER_ADDR")) env.master_addr = *addr;
  env.master_port = vars.get_int("MASTER_PORT").value_or(kDefaultPort);
  validate(env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_PORT"});
  return env;
}

// A decimal number of at most 9 digits, so that it fits an int.
int parse_count(const std::string& text, const std::string& what) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  KUAFU_CHECK(!text.empty() && text[0] != '-' && ec == std::errc() && ptr == end,
              "'", text, "' is not a valid ", what);
  return value;
}

// Expands one hostlist item ("rack[1-2]-n[01-04]") from `pos` on, appending to `out`.
void expand_item(const std::string& item, std::size_t pos, const std::string& prefix,
                 std::vector<std::string>& out, std::size_t limit) {
  std::size_t open = item.find('[', pos);
  if (open == std::string::npos) {
    out.push_back(prefix + item.substr(pos));
    return;
  }
  std::size_t close = item.find(']', open);
  KUAFU_CHECK(close != std::string::npos, "'[' without ']' in '", item, "'");
  KUAFU_CHECK(close > open + 1 && item[close - 1] != ',', "empty range in '", item, "'");
  const std::string head = prefix + item.substr(pos, open - pos);
  std::stringstream ranges(item.substr(open + 1, close - open - 1));
  std::string range;
  while (std::getline(ranges, range, ',')) {
    std::size_t dash = range.find('-');
    std::string low_text = range.substr(0, dash);
    int low = parse_count(low_text, "host number");
    int high = dash == std::string::npos ? low : parse_count(range.substr(dash + 1), "host number");
    KUAFU_CHECK(low <= high, "descending range '", range, "' in '", item, "'");
    for (int n = low; n <= high && out.size() < limit; ++n) {
      std::string number = std::to_string(n);
      if (number.size() < low_text.size()) {  // keep the padding of the lower bound: 01, 02, ...
        number.insert(0, low_text.size() - number.size(), '0');
      }
      expand_item(item, close + 1, head + number, out, limit);
    }
  }
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& hostlist, std::size_t limit) {
  KUAFU_CHECK(!hostlist.empty(), "the Slurm hostlist is empty");
  // Split on the commas that are outside brackets.
  std::vector<std::string> items(1);
  int depth = 0;
  for (char c : hostlist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    KUAFU_CHECK(depth == 0 || depth == 1, "unbalanced brackets in Slurm hostlist '", hostlist, "'");
    if (c == ',' && depth == 0) {
      items.emplace_back();
    } else {
      items.back() += c;
    }
  }
  KUAFU_CHECK(depth == 0, "unbalanced brackets in Slurm hostlist '", hostlist, "'");

  std::vector<std::string> hosts;
  for (const auto& item : items) {
    KUAFU_CHECK(!item.empty(), "empty host name in Slurm hostlist '", hostlist, "'");
    if (hosts.size() >= limit) break;
    expand_item(item, 0, "", hosts, limit);
  }
  return hosts;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  std::stringstream entries(tasks_per_node);
  std::string entry;
  int first_node = 0;  // index of the first node the current entry describes
  while (std::getline(entries, entry, ',')) {
    int repeat = 1;
    std::size_t paren = entry.find('(');
    if (paren != std::string::npos) {  // "4(x2)": 4 tasks on each of 2 nodes
      KUAFU_CHECK(entry.size() > paren + 3 && entry.compare(paren, 2, "(x") == 0 &&
                      entry.back() == ')',
                  "'", entry, "' is not of the form N or N(xK)");
      repeat = parse_count(entry.substr(paren + 2, entry.size() - paren - 3), "repeat count");
    }
    int tasks = parse_count(entry.substr(0, paren), "task count");
    if (node < first_node + repeat) return tasks;
    first_node += repeat;
  }
  fail("it lists " + std::to_string(first_node) + " nodes, not node " + std::to_string(node));
}

LaunchEnv detect_launch_env(const EnvLookup& lookup) {
  Vars vars(lookup);
  if (vars.has("RANK") || vars.has("WORLD_SIZE")) return from_torchrun(vars);
  if (vars.has("SLURM_PROCID")) return from_slurm(vars);
  if (vars.has("OMPI_COMM_WORLD_RANK") || vars.has("OMPI_COMM_WORLD_SIZE")) return from_openmpi(vars);
  return single(vars);
}

LaunchEnv detect_launch_env() {
  return detect_launch_env([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

std::string describe(const LaunchEnv& env) {
  std::ostringstream out;
  out << env.launcher << ": rank " << env.rank << " of " << env.world_size << " (local "
      << env.local_rank << " of " << env.local_world_size << ", node " << env.node_rank
      << "), master " << env.master_addr << ":" << env.master_port;
  if (env.use_agent_store) out << ", agent store";
  return out.str();
}

}  // namespace kuafu::dist

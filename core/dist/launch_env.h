// Where this process sits in a distributed job (rank, world size, rendezvous address), read from the
// variables that torchrun / kuafu-run, Slurm or OpenMPI set; a lone process is rank 0 of 1.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kuafu::dist {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's TORCHELASTIC_USE_AGENT_STORE=True: the agent hosts the TCPStore, so rank 0 must
  // connect to it as a client instead of starting its own server.
  bool use_agent_store = false;
  // KUAFU_MASTER_PORT_FILE (single node, set by kuafu-run and the test harness with MASTER_PORT=0):
  // rank 0's store binds a free port itself and writes its number here; the other ranks read it. A
  // port chosen in advance could be taken by another process before the store binds it.
  std::string port_file;
  std::string launcher = "single";  // "torchrun" (also kuafu-run), "slurm", "openmpi", "single"
};

// Returns the value of an environment variable, or nullopt when unset. Tests pass fakes.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// Detects the launcher, in this order: torchrun variables (RANK, WORLD_SIZE, ...), Slurm
// (SLURM_PROCID, ...), OpenMPI (OMPI_COMM_WORLD_RANK, ...), else a single process. Empty values
// count as unset. Throws kuafu::Error naming the variable and its value when one is malformed or
// inconsistent (not a number, rank >= world size, negative, port outside 1..65535).
//
// Slurm: the master address is MASTER_ADDR, else the first host of SLURM_STEP_NODELIST (or
// SLURM_JOB_NODELIST); the port is MASTER_PORT, else 29500 + SLURM_JOB_ID % 1000 so that two jobs
// sharing a node rarely collide. OpenMPI: MASTER_ADDR must be exported when the world has more
// than one process; the node rank is rank / local size (ranks mapped by slot).
LaunchEnv detect_launch_env(const EnvLookup& env);
LaunchEnv detect_launch_env();  // the real environment

// One line for the log: "torchrun: rank 3 of 8 (local 1 of 4, node 1), master 10.0.0.1:29500".
std::string describe(const LaunchEnv& env);

// Expands a Slurm hostlist such as "gpu[01-03,07],cpu3" into gpu01 gpu02 gpu03 gpu07 cpu3, keeping
// the zero padding; stops after `limit` hosts. Throws kuafu::Error on malformed lists.
std::vector<std::string> expand_slurm_hostlist(const std::string& hostlist,
                                               std::size_t limit = static_cast<std::size_t>(-1));

// Tasks on node `node` from a Slurm tasks-per-node list such as "4(x2),3" (4, 4, 3).
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace kuafu::dist

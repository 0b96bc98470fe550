// Tests of launch environment detection: torchrun, Slurm, OpenMPI and single process from fake
// environments, Slurm hostlists, and an error naming the variable for every malformed value.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/dist/launch_env.h"
#include "core/util/error.h"

namespace kuafu::dist {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup fake(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto found = vars.find(name);
    if (found == vars.end()) return std::nullopt;
    return found->second;
  };
}

// The message of the kuafu::Error that detect_launch_env throws, or "" when it throws none.
std::string error_of(const Vars& vars) {
  try {
    detect_launch_env(fake(vars));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Expects an error that names `variable` and its `value`.
void expect_error(const Vars& vars, const std::string& variable, const std::string& value) {
  const std::string message = error_of(vars);
  ASSERT_FALSE(message.empty()) << "no error for " << variable << "=" << value;
  EXPECT_NE(message.find(variable), std::string::npos) << message;
  EXPECT_NE(message.find(value), std::string::npos) << message;
}

const Vars kTorchrun = {{"RANK", "5"},        {"WORLD_SIZE", "8"},        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"},   {"MASTER_ADDR", "node7"},
                        {"MASTER_PORT", "23456"}};

Vars with(Vars vars, const Vars& changes) {
  for (const auto& [name, value] : changes) vars[name] = value;
  return vars;
}

TEST(LaunchEnvTest, SingleProcessWhenNothingIsSet) {
  LaunchEnv env = detect_launch_env(fake({}));
  EXPECT_EQ(env.launcher, "single");
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_FALSE(env.use_agent_store);
}

TEST(LaunchEnvTest, Torchrun) {
  LaunchEnv env = detect_launch_env(fake(with(kTorchrun, {{"TORCHELASTIC_USE_AGENT_STORE", "True"}})));
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "node7");
  EXPECT_EQ(env.master_port, 23456);
  EXPECT_TRUE(env.use_agent_store);
  EXPECT_EQ(describe(env), "torchrun: rank 5 of 8 (local 1 of 4, node 1), master node7:23456, "
                           "agent store");
}

TEST(LaunchEnvTest, TorchrunWithOnlyRankAndWorldSizeIsOneNode) {
  LaunchEnv env = detect_launch_env(fake({{"RANK", "2"}, {"WORLD_SIZE", "3"},
                                          {"MASTER_ADDR", "10.1.2.3"}, {"LOCAL_RANK", ""}}));
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.local_world_size, 3);
  EXPECT_EQ(env.node_rank, 0);
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_FALSE(env.use_agent_store);
}

TEST(LaunchEnvTest, TorchrunTakesPriorityOverSlurmAndOpenMpi) {
  LaunchEnv env = detect_launch_env(fake(with(kTorchrun, {{"SLURM_PROCID", "0"},
                                                          {"OMPI_COMM_WORLD_RANK", "0"}})));
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 5);
}

TEST(LaunchEnvTest, TorchrunErrorsNameTheVariable) {
  expect_error(with(kTorchrun, {{"RANK", "five"}}), "RANK", "five");
  expect_error(with(kTorchrun, {{"RANK", "8"}}), "RANK", "8");
  expect_error(with(kTorchrun, {{"RANK", "-1"}}), "RANK", "-1");
  expect_error(with(kTorchrun, {{"RANK", "3x"}}), "RANK", "3x");
  expect_error(with(kTorchrun, {{"WORLD_SIZE", "0"}, {"RANK", "0"}}), "WORLD_SIZE", "0");
  expect_error(with(kTorchrun, {{"WORLD_SIZE", "99999999999"}}), "WORLD_SIZE", "99999999999");
  expect_error(with(kTorchrun, {{"LOCAL_RANK", "4"}}), "LOCAL_RANK", "4");
  expect_error(with(kTorchrun, {{"LOCAL_WORLD_SIZE", "9"}}), "LOCAL_WORLD_SIZE", "9");
  expect_error(with(kTorchrun, {{"GROUP_RANK", "-2"}}), "GROUP_RANK", "-2");
  expect_error(with(kTorchrun, {{"MASTER_PORT", "70000"}}), "MASTER_PORT", "70000");
  expect_error(with(kTorchrun, {{"MASTER_PORT", "0"}}), "MASTER_PORT", "0");
  expect_error(with(kTorchrun, {{"MASTER_PORT", "http"}}), "MASTER_PORT", "http");
  expect_error(with(kTorchrun, {{"TORCHELASTIC_USE_AGENT_STORE", "maybe"}}),
               "TORCHELASTIC_USE_AGENT_STORE", "maybe");
  expect_error({{"RANK", "0"}}, "WORLD_SIZE", "not set");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "MASTER_ADDR", "not set");
}

// Before: "WORLD_SIZE='99999999999' is not an integer", and a world of -1 without MASTER_ADDR asked
// for MASTER_ADDR ("the torchrun world has -1 processes") instead of naming the bad size.
TEST(LaunchEnvTest, ANumberTooLargeOrANegativeWorldIsSaidSo) {
  const std::string large = error_of(with(kTorchrun, {{"WORLD_SIZE", "99999999999"}}));
  EXPECT_NE(large.find("WORLD_SIZE='99999999999' is out of range"), std::string::npos) << large;
  const std::string negative = error_of({{"RANK", "0"}, {"WORLD_SIZE", "-1"}});
  EXPECT_NE(negative.find("WORLD_SIZE=-1 must be at least 1"), std::string::npos) << negative;
  const std::string mpi = error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_NE(mpi.find("OMPI_COMM_WORLD_SIZE=0 must be at least 1"), std::string::npos) << mpi;
}

const Vars kSlurm = {{"SLURM_PROCID", "5"},   {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"},  {"SLURM_NODEID", "1"},
                     {"SLURM_TASKS_PER_NODE", "4(x2)"},
                     {"SLURM_JOB_NODELIST", "gpu[01-04,07],cpu3"}, {"SLURM_JOB_ID", "123456"}};

TEST(LaunchEnvTest, Slurm) {
  LaunchEnv env = detect_launch_env(fake(kSlurm));
  EXPECT_EQ(env.launcher, "slurm");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "gpu01");
  EXPECT_EQ(env.master_port, 29500 + 456);
}

TEST(LaunchEnvTest, SlurmPrefersExplicitValuesAndTheStepNodelist) {
  LaunchEnv env = detect_launch_env(fake(with(kSlurm, {{"SLURM_NTASKS_PER_NODE", "4"},
                                                       {"SLURM_TASKS_PER_NODE", "junk"},
                                                       {"SLURM_STEP_NODELIST", "a[3-4]"}})));
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "a3");
  env = detect_launch_env(fake(with(kSlurm, {{"MASTER_ADDR", "head"}, {"MASTER_PORT", "4000"}})));
  EXPECT_EQ(env.master_addr, "head");
  EXPECT_EQ(env.master_port, 4000);
}

TEST(LaunchEnvTest, SlurmUnevenTasksPerNode) {
  LaunchEnv env = detect_launch_env(fake(with(kSlurm, {{"SLURM_NTASKS", "7"}, {"SLURM_PROCID", "6"},
                                                       {"SLURM_NODEID", "2"}, {"SLURM_LOCALID", "0"},
                                                       {"SLURM_TASKS_PER_NODE", "3(x2),1"}})));
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.node_rank, 2);
}

TEST(LaunchEnvTest, SlurmErrorsNameTheVariable) {
  expect_error(with(kSlurm, {{"SLURM_PROCID", "8"}}), "SLURM_PROCID", "8");
  expect_error(with(kSlurm, {{"SLURM_NTASKS", "many"}}), "SLURM_NTASKS", "many");
  expect_error(with(kSlurm, {{"SLURM_LOCALID", "4"}}), "SLURM_LOCALID", "4");
  expect_error(with(kSlurm, {{"SLURM_NODEID", "-1"}}), "SLURM_NODEID", "-1");
  expect_error(with(kSlurm, {{"SLURM_NODEID", "2"}}), "SLURM_TASKS_PER_NODE", "4(x2)");
  expect_error(with(kSlurm, {{"SLURM_TASKS_PER_NODE", "4(2)"}}), "SLURM_TASKS_PER_NODE", "4(2)");
  expect_error(with(kSlurm, {{"SLURM_JOB_NODELIST", "gpu[01-04"}}), "SLURM_JOB_NODELIST", "gpu[01-04");
  expect_error(with(kSlurm, {{"SLURM_JOB_ID", "-5"}}), "SLURM_JOB_ID", "-5");
  expect_error(with(kSlurm, {{"MASTER_PORT", "65536"}}), "MASTER_PORT", "65536");
  Vars no_nodelist = kSlurm;
  no_nodelist.erase("SLURM_JOB_NODELIST");
  expect_error(no_nodelist, "MASTER_ADDR", "SLURM_JOB_NODELIST");
  Vars no_ntasks = kSlurm;
  no_ntasks.erase("SLURM_NTASKS");
  expect_error(no_ntasks, "SLURM_NTASKS", "srun");
}

TEST(LaunchEnvTest, SlurmHostlists) {
  using Hosts = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_hostlist("gpu[01-04,07],cpu3"),
            (Hosts{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"}));
  EXPECT_EQ(expand_slurm_hostlist("node7"), (Hosts{"node7"}));
  EXPECT_EQ(expand_slurm_hostlist("n[9-11]"), (Hosts{"n9", "n10", "n11"}));
  EXPECT_EQ(expand_slurm_hostlist("r[1-2]-n[008-009]"),
            (Hosts{"r1-n008", "r1-n009", "r2-n008", "r2-n009"}));
  EXPECT_EQ(expand_slurm_hostlist("a,b[1-3]", 2), (Hosts{"a", "b1"}));
  EXPECT_EQ(expand_slurm_hostlist("x[0-99999999]", 1), (Hosts{"x0"}));
  for (const char* bad : {"", "gpu[01-04", "gpu]1[", "gpu[[1]]", "gpu[]", "gpu[4-1]", "gpu[a-b]",
                          "gpu[1,]", "a,,b", "gpu[1-]"}) {
    EXPECT_THROW(expand_slurm_hostlist(bad), Error) << bad;
  }
}

TEST(LaunchEnvTest, SlurmTasksPerNode) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 1), 4);
  EXPECT_EQ(slurm_tasks_on_node("4(x2),3", 2), 3);
  EXPECT_EQ(slurm_tasks_on_node("2,5(x3)", 3), 5);
  EXPECT_THROW(slurm_tasks_on_node("4(x2),3", 3), Error);
  EXPECT_THROW(slurm_tasks_on_node("4(x)", 0), Error);
  EXPECT_THROW(slurm_tasks_on_node("x", 0), Error);
}

const Vars kOpenMpi = {{"OMPI_COMM_WORLD_RANK", "3"},       {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"MASTER_ADDR", "host0"}};

TEST(LaunchEnvTest, OpenMpi) {
  LaunchEnv env = detect_launch_env(fake(kOpenMpi));
  EXPECT_EQ(env.launcher, "openmpi");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.master_addr, "host0");
  EXPECT_EQ(env.master_port, 29500);
}

TEST(LaunchEnvTest, OpenMpiErrorsNameTheVariable) {
  Vars no_addr = kOpenMpi;
  no_addr.erase("MASTER_ADDR");
  const std::string message = error_of(no_addr);
  EXPECT_NE(message.find("MASTER_ADDR"), std::string::npos) << message;
  EXPECT_NE(message.find("export"), std::string::npos) << message;
  // One process needs no address.
  EXPECT_EQ(detect_launch_env(fake({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}}))
                .master_addr,
            "127.0.0.1");
  expect_error(with(kOpenMpi, {{"OMPI_COMM_WORLD_RANK", "4"}}), "OMPI_COMM_WORLD_RANK", "4");
  expect_error(with(kOpenMpi, {{"OMPI_COMM_WORLD_SIZE", "1.5"}}), "OMPI_COMM_WORLD_SIZE", "1.5");
  expect_error(with(kOpenMpi, {{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}), "OMPI_COMM_WORLD_LOCAL_RANK", "2");
  expect_error(with(kOpenMpi, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "0"}}), "OMPI_COMM_WORLD_LOCAL_SIZE", "0");
  expect_error(with(kOpenMpi, {{"MASTER_PORT", "-80"}}), "MASTER_PORT", "-80");
}

TEST(LaunchEnvTest, SingleProcessValidatesMasterPort) {
  expect_error({{"MASTER_PORT", "99999"}}, "MASTER_PORT", "99999");
  EXPECT_EQ(detect_launch_env(fake({{"MASTER_PORT", "1234"}, {"MASTER_ADDR", "h"}})).master_port, 1234);
}

}  // namespace
}  // namespace kuafu::dist

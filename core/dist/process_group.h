// ProcessGroup: a set of ranks with its c10d backend (Gloo on CPU, NCCL on CUDA); World: the
// rendezvous (TCPStore) and the group of all ranks, from which every other group is made.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/dist/compat.h"
#include "core/dist/launch_env.h"

namespace kuafu::dist {

enum class BackendKind { kGloo, kNccl };

// Bytes a group's collectives moved from this rank's point of view (for communication accounting).
struct CommCounters {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

class ProcessGroup {
 public:
  ProcessGroup(std::string name, std::vector<int> global_ranks, int rank,
               c10::intrusive_ptr<compat::Backend> backend, BackendKind kind, torch::Device device,
               std::chrono::milliseconds timeout);

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }  // this process's rank inside the group
  int size() const { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  BackendKind kind() const { return kind_; }
  bool is_gloo() const { return kind_ == BackendKind::kGloo; }
  torch::Device device() const { return device_; }  // where this group's tensors must live
  std::chrono::milliseconds timeout() const { return timeout_; }
  compat::Backend& backend() const { return *backend_; }  // null for a group of one
  bool trivial() const { return size() == 1; }

  // Waits for `work`, turning a peer failure or time-out into a kuafu::Error naming this group.
  void wait(const c10::intrusive_ptr<compat::Work>& work, const char* what) const;

  CommCounters& counters() const { return counters_; }
  void count(int64_t sent, int64_t received) const;

 private:
  std::string name_;
  std::vector<int> global_ranks_;
  int rank_;
  c10::intrusive_ptr<compat::Backend> backend_;
  BackendKind kind_;
  torch::Device device_;
  std::chrono::milliseconds timeout_;
  mutable CommCounters counters_;
};

using GroupPtr = std::shared_ptr<const ProcessGroup>;

struct WorldOptions {
  std::string device = "auto";   // runtime.device: "auto", "cpu", "cuda" (the local rank's GPU), "cuda:N"
  std::string backend = "auto";  // "auto" (NCCL on a GPU, Gloo on the CPU), "gloo", "nccl"
  std::chrono::seconds timeout{300};
};

class World {
 public:
  // Chooses the device (selected as this process's current GPU) and backend, rendezvouses through
  // TCPStore at env.master_addr:master_port (rank 0 hosts it unless torchrun's agent already does) and
  // creates the group of all ranks.
  static std::shared_ptr<World> init(const LaunchEnv& env, const WorldOptions& options);
  // A world of one process with no store (no communication ever happens).
  static std::shared_ptr<World> single();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const LaunchEnv& env() const { return env_; }
  GroupPtr world_group() const { return world_group_; }
  torch::Device device() const { return device_; }  // where this process computes; every group's tensors live there

  // Creates the group of `global_ranks` (sorted, containing this rank). Only members call it; every
  // member must pass the same ranks and name. Names must be unique in the world.
  GroupPtr new_group(const std::string& name, std::vector<int> global_ranks) const;

  // Every group this process belongs to, in creation order (for communication accounting).
  std::vector<GroupPtr> groups() const;

 private:
  World() = default;
  c10::intrusive_ptr<compat::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size) const;

  LaunchEnv env_;
  int rank_ = 0;
  int size_ = 1;
  BackendKind kind_ = BackendKind::kGloo;
  torch::Device device_{torch::kCPU};
  std::chrono::milliseconds timeout_{300000};
  c10::intrusive_ptr<c10d::Store> store_;
  GroupPtr world_group_;
  mutable std::mutex groups_mutex_;
  mutable std::vector<GroupPtr> groups_;
  mutable std::map<std::string, int> created_;  // groups created so far, by name and members
};

}  // namespace kuafu::dist

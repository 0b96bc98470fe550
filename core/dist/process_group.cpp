#include "core/dist/process_group.h"

#include <algorithm>

#include "core/util/error.h"
#include "core/util/logging.h"

namespace kuafu::dist {

ProcessGroup::ProcessGroup(std::string name, std::vector<int> global_ranks, int rank,
                           c10::intrusive_ptr<compat::Backend> backend, BackendKind kind,
                           torch::Device device, std::chrono::milliseconds timeout)
    : name_(std::move(name)),
      global_ranks_(std::move(global_ranks)),
      rank_(rank),
      backend_(std::move(backend)),
      kind_(kind),
      device_(device),
      timeout_(timeout) {}

void ProcessGroup::wait(const c10::intrusive_ptr<compat::Work>& work, const char* what) const {
  try {
    work->wait(timeout_);
  } catch (const std::exception& e) {
    throw Error(detail::concat("communication failed in process group '", name_, "' during ", what,
                               " (rank ", rank_, " of ", size(), ", timeout ", timeout_.count() / 1000,
                               " s): another rank probably failed or stopped; see its log. Cause: ",
                               e.what()));
  }
}

void ProcessGroup::count(int64_t sent, int64_t received) const {
  counters_.calls += 1;
  counters_.bytes_sent += sent;
  counters_.bytes_received += received;
}

namespace {

BackendKind choose_backend(const std::string& requested) {
  if (requested == "gloo") return BackendKind::kGloo;
  if (requested == "nccl") {
#ifdef KUAFU_WITH_CUDA
    KUAFU_CHECK(torch::cuda::is_available(), "dist.backend = \"nccl\" but no CUDA device is available");
    return BackendKind::kNccl;
#else
    fail("dist.backend = \"nccl\" but this build of Kuafu has no CUDA (LibTorch without CUDA)");
#endif
  }
  KUAFU_CHECK(requested == "auto", "dist.backend must be auto, gloo or nccl; found \"", requested, "\"");
#ifdef KUAFU_WITH_CUDA
  if (torch::cuda::is_available()) return BackendKind::kNccl;
#endif
  return BackendKind::kGloo;
}

std::shared_ptr<::gloo::transport::Device> make_gloo_device(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  // Single-host runs talk over loopback; that also works where the hostname does not resolve.
  if (master_addr == "127.0.0.1" || master_addr == "localhost") {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

c10::intrusive_ptr<compat::Backend> World::make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                        int rank, int size) const {
#ifdef KUAFU_WITH_CUDA
  if (kind_ == BackendKind::kNccl) {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout_;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  }
#endif
  auto options = c10d::ProcessGroupGloo::Options::create(timeout_);
  options->devices.push_back(make_gloo_device(env_.master_addr));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

std::shared_ptr<World> World::single() {
  auto world = std::shared_ptr<World>(new World());
  world->world_group_ = std::make_shared<ProcessGroup>("world", std::vector<int>{0}, 0, c10::intrusive_ptr<compat::Backend>(),
                                                       BackendKind::kGloo, world->device_,
                                                       world->timeout_);
  return world;
}

std::shared_ptr<World> World::init(const LaunchEnv& env, const WorldOptions& options) {
  auto world = std::shared_ptr<World>(new World());
  world->env_ = env;
  world->rank_ = env.rank;
  world->size_ = env.world_size;
  world->timeout_ = std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout);
  world->kind_ = choose_backend(options.backend);
#ifdef KUAFU_WITH_CUDA
  if (world->kind_ == BackendKind::kNccl) {
    world->device_ = torch::Device(torch::kCUDA, env.local_rank);
  }
#endif
  if (env.world_size == 1) {
    auto single = World::single();
    single->env_ = env;
    single->device_ = world->device_;
    return single;
  }
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0 && !env.use_agent_store;
  store_options.numWorkers = env.world_size;
  store_options.timeout = world->timeout_;
  try {
    world->store_ = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const std::exception& e) {
    throw Error(detail::concat("rendezvous at ", env.master_addr, ":", env.master_port, " failed for rank ",
                               env.rank, " of ", env.world_size, ": ", e.what()));
  }
  std::vector<int> all(env.world_size);
  for (int r = 0; r < env.world_size; ++r) all[r] = r;
  world->world_group_ = world->new_group("world", all);
  return world;
}

GroupPtr World::new_group(const std::string& name, std::vector<int> global_ranks) const {
  std::sort(global_ranks.begin(), global_ranks.end());
  const auto self = std::find(global_ranks.begin(), global_ranks.end(), rank_);
  KUAFU_CHECK(self != global_ranks.end(), "rank ", rank_, " asked to create group '", name,
              "' that does not contain it");
  const int group_rank = static_cast<int>(self - global_ranks.begin());
  const int group_size = static_cast<int>(global_ranks.size());
  // A second group of the same name (e.g. a second mesh in the same processes) must not meet the first
  // one's rendezvous keys in the store: each creation gets its own prefix, the same on every member
  // because groups are created in the same order everywhere.
  int generation = 0;
  {
    std::lock_guard<std::mutex> lock(groups_mutex_);
    generation = created_[name]++;
  }
  c10::intrusive_ptr<compat::Backend> backend;
  if (group_size > 1) {
    KUAFU_CHECK(store_, "group '", name, "' needs several ranks but the world has no store");
    auto store = c10::make_intrusive<c10d::PrefixStore>(
        "kuafu/" + name + (generation ? "#" + std::to_string(generation) : std::string()), store_);
    backend = make_backend(store, group_rank, group_size);
  }
  auto group = std::make_shared<ProcessGroup>(name, std::move(global_ranks), group_rank, std::move(backend), kind_,
                                              device_, timeout_);
  std::lock_guard<std::mutex> lock(groups_mutex_);
  groups_.push_back(group);
  return group;
}

std::vector<GroupPtr> World::groups() const {
  std::lock_guard<std::mutex> lock(groups_mutex_);
  return groups_;
}

}  // namespace kuafu::dist

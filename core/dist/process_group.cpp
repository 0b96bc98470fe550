#include "core/dist/process_group.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "core/dist/deadline.h"
#include "core/util/atomic_file.h"
#include "core/util/device.h"
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

// NCCL for GPU tensors, Gloo for CPU tensors: a group's collectives take tensors on the run's device.
BackendKind choose_backend(const std::string& requested, const torch::Device& device) {
  KUAFU_CHECK(requested == "auto" || requested == "gloo" || requested == "nccl",
              "dist.backend must be auto, gloo or nccl; found \"", requested, "\"");
  if (requested == "nccl" || (requested == "auto" && device.is_cuda())) {
    KUAFU_CHECK(compat::kHasNccl, "dist.backend = \"nccl\" but this build of Kuafu has no CUDA");
    KUAFU_CHECK(device.is_cuda(), "dist.backend = \"nccl\" needs runtime.device on a GPU, not ", device);
    return BackendKind::kNccl;
  }
  KUAFU_CHECK(device.is_cpu(), "dist.backend = \"gloo\" moves CPU tensors, but runtime.device is ", device,
              "; use dist.backend = \"nccl\" (or \"auto\") on GPUs");
  return BackendKind::kGloo;
}

// The address this host reaches `master_addr` from: the kernel's route choice, read back from a UDP
// socket connected there (no packet is sent). Empty when the address does not resolve or has no route.
std::string local_address_towards(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(master_addr.c_str(), "9", &hints, &found) != 0) return {};
  std::string local;
  for (const addrinfo* a = found; a && local.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage self{};
    socklen_t length = sizeof(self);
    char text[NI_MAXHOST] = {};
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &length) == 0 &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&self), length, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) == 0) {
      local = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return local;
}

std::shared_ptr<::gloo::transport::Device> make_gloo_device(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  // Single-host runs talk over loopback; that also works where the hostname does not resolve.
  if (master_addr == "127.0.0.1" || master_addr == "localhost") {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  // Across hosts each rank listens on the address its host reaches the master from: the interface the
  // job's network is on. The hostname's address (Gloo's default) may be another network's, or loopback
  // (Debian maps the hostname to 127.0.1.1), where peers on other hosts cannot connect.
  const std::string local = local_address_towards(master_addr);
  KUAFU_CHECK(!local.empty(), "this host has no route to the master address ", master_addr,
              "; set MASTER_ADDR (kuafu-run --master-addr) to an address of rank 0's host that this host reaches, "
              "or GLOO_SOCKET_IFNAME to the interface to use");
  return c10d::ProcessGroupGloo::createDeviceForHostname(local);
}


// Reads the port rank 0 published in `path`, waiting for it until `timeout`.
int wait_for_published_port(const std::string& path, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0 && port < 65536) return port;
    KUAFU_CHECK(std::chrono::steady_clock::now() < deadline, "rendezvous: rank 0 did not publish its store's port in ",
                path, " within ", timeout.count() / 1000, " s; see rank 0's log");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A listening socket on the address the run names, and only there: TCPStore on its own listens on
// every interface, which for a single-node run opens an unauthenticated store to the network.
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  KUAFU_CHECK(resolved == 0, "rendezvous: the master address ", host, " does not resolve: ", ::gai_strerror(resolved));
  std::string failure;
  for (const addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    failure = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  fail(detail::concat("rendezvous: cannot listen on ", host, ":", port, " (", failure, "); the master address must "
                      "be this host's (rank 0's), e.g. 127.0.0.1 for a single node"));
}

// The rendezvous store: rank 0 hosts it (unless torchrun's agent does), the others connect. With
// master port 0 the server binds a free port and rank 0 publishes it in env.port_file. The server
// listens on the master address only.
c10::intrusive_ptr<c10d::Store> connect_store(const LaunchEnv& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.isServer = env.rank == 0 && !env.use_agent_store;
  if (options.isServer) options.masterListenFd = listen_on(env.master_addr, env.master_port);
  options.numWorkers = env.world_size;
  options.timeout = timeout;
  const bool published = env.master_port == 0;
  // The server must not wait for the workers before it has published the port they need to connect.
  options.waitWorkers = !published;
  KUAFU_CHECK(!published || (!env.port_file.empty() && !env.use_agent_store),
              "MASTER_PORT=0 needs KUAFU_MASTER_PORT_FILE (kuafu-run sets both) and a store hosted by rank 0");
  options.port = static_cast<std::uint16_t>(
      published && !options.isServer ? wait_for_published_port(env.port_file, timeout) : env.master_port);
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    throw Error(detail::concat("rendezvous at ", env.master_addr, ":", options.port, " failed for rank ", env.rank,
                               " of ", env.world_size, ": ", e.what()));
  }
  if (published) {
    if (options.isServer) write_file_atomic(env.port_file, std::to_string(store->getPort()) + "\n");
    store->waitForWorkers();  // every rank checks in; the server returns once all have
  }
  return store;
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
  world->device_ = resolve_device(options.device, env.local_rank);
  select_device(world->device_);  // before NCCL creates its communicators on the current device
  world->kind_ = choose_backend(options.backend, world->device_);
  if (env.world_size == 1) {
    auto single = World::single();
    single->env_ = env;
    single->device_ = world->device_;
    return single;
  }
  world->store_ = connect_store(env, world->timeout_);
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
  // one's rendezvous keys in the store: each creation gets its own prefix. The prefix names the members
  // and counts the creations of that name over those members, which every member makes together, so it
  // is the same on each; a count by name alone differs between ranks once meshes of other shapes reuse
  // a name over other members (mesh data 2 x dap 2 then dap 4 both have "data=0,dap=*").
  std::string members;
  for (int r : global_ranks) members += (members.empty() ? "" : ",") + std::to_string(r);
  const std::string key = name + "@" + members;
  int generation = 0;
  {
    std::lock_guard<std::mutex> lock(groups_mutex_);
    generation = created_[key]++;
  }
  // Connecting must end, one way or the other, soon after the time-out: Gloo may otherwise wait for a
  // vanished peer for ever (see deadline.h).
  std::optional<Deadline> deadline;
  if (group_size > 1) {
    deadline.emplace(detail::concat("rank ", rank_, " connecting process group '", name, "' (", group_size, " ranks)"),
                     timeout_ + std::chrono::seconds(10),
                     "a peer probably failed or never started: see the other ranks' logs, on every host");
  }
  c10::intrusive_ptr<compat::Backend> backend;
  if (group_size > 1) {
    KUAFU_CHECK(store_, "group '", name, "' needs several ranks but the world has no store");
    auto store = c10::make_intrusive<c10d::PrefixStore>(
        "kuafu/" + key + (generation ? "#" + std::to_string(generation) : std::string()), store_);
    backend = make_backend(store, group_rank, group_size);
  }
  auto group = std::make_shared<ProcessGroup>(name, std::move(global_ranks), group_rank, std::move(backend), kind_,
                                              device_, timeout_);
  // Gloo connects a group's pairs eagerly, and a member may finish its side before its peers do. A
  // member that then failed or finished and exited (a refused config, a short test) broke the others'
  // connecting ("Connection closed by peer" under load): nobody leaves until every member is connected.
  if (kind_ == BackendKind::kGloo && !group->trivial()) group->wait(group->backend().barrier(), "connecting the group");
  deadline.reset();
  std::lock_guard<std::mutex> lock(groups_mutex_);
  groups_.push_back(group);
  return group;
}

std::vector<GroupPtr> World::groups() const {
  std::lock_guard<std::mutex> lock(groups_mutex_);
  return groups_;
}

}  // namespace kuafu::dist

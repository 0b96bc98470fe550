// Collectives (plain and autograd) over real Gloo ranks, each checked against the same computation
// done serially on one process. fp32 results are exact up to summation order (1e-6); gradients are
// checked in float64 (1e-12) because every rank can compute the serial reference itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/dist/autograd_collectives.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/dist/collectives.h"
#include "core/dist/process_mesh.h"
#include "tests/support/multiprocess.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

using testing::run_test_on_ranks;

// Rank r's input: deterministic, different per rank, the same on every process that asks.
torch::Tensor input_of(int rank, at::IntArrayRef shape, torch::ScalarType type = torch::kFloat32) {
  torch::manual_seed(100 + rank);
  return torch::randn(shape, torch::TensorOptions().dtype(type));
}

void check_plain_collectives() {
  auto world = testing::worker_world();
  const auto& g = *world->world_group();
  const int p = g.size(), r = g.rank();
  std::vector<torch::Tensor> all;
  for (int k = 0; k < p; ++k) all.push_back(input_of(k, {4 * p, 3}));
  const torch::Tensor sum = torch::stack(all).sum(0);

  torch::Tensor x = all[r].clone();
  dist::all_reduce(x, g);
  EXPECT_TRUE(torch::allclose(x, sum, 1e-6, 1e-6));

  torch::Tensor m = all[r].clone();
  dist::all_reduce(m, g, dist::Reduce::kMax);
  EXPECT_TRUE(torch::equal(m, std::get<0>(torch::stack(all).max(0))));

  EXPECT_TRUE(torch::equal(dist::all_gather(all[r], g, 1), torch::cat(all, 1)));
  EXPECT_TRUE(torch::allclose(dist::reduce_scatter(all[r], g, 0), sum.chunk(p, 0)[r], 1e-6, 1e-6));

  // all_to_all: rank r receives part r of every rank's tensor, concatenated in rank order.
  std::vector<torch::Tensor> expected_parts;
  for (int k = 0; k < p; ++k) expected_parts.push_back(all[k].chunk(p, 0)[r]);
  EXPECT_TRUE(torch::equal(dist::all_to_all(all[r], g, 0, 1), torch::cat(expected_parts, 1)));

  torch::Tensor b = all[r].clone();
  dist::broadcast(b, g, p - 1);
  EXPECT_TRUE(torch::equal(b, all[p - 1]));

  // reduce: only the root's tensor holds the sum (the others are scratch).
  torch::Tensor red = all[r].clone();
  dist::reduce(red, g, /*root=*/p - 1);
  if (r == p - 1) {
    EXPECT_TRUE(torch::allclose(red, sum, 1e-6, 1e-6));
  }
  torch::Tensor red_avg = all[r].clone();
  dist::reduce(red_avg, g, /*root=*/0, dist::Reduce::kAvg);
  if (r == 0) {
    EXPECT_TRUE(torch::allclose(red_avg, sum / p, 1e-6, 1e-6));
  }

  // bf16 travels and is summed as bf16 (Gloo since LibTorch 2.x, as NCCL): each of the p - 1 additions
  // rounds once, by at most 2^-8 of the partial sum, so the result is within (p - 1) 2^-8 sum |x| of the
  // exact sum of the bf16 values. On 2 ranks one rounding of the exact sum: equal to it rounded.
  torch::Tensor h = all[r].to(torch::kBFloat16);
  dist::all_reduce(h, g);
  EXPECT_EQ(h.scalar_type(), torch::kBFloat16);
  torch::Tensor bf_sum = torch::zeros_like(sum), bf_abs_sum = torch::zeros_like(sum);
  for (const auto& t : all) {
    bf_sum += t.to(torch::kBFloat16).to(torch::kFloat32);
    bf_abs_sum += t.to(torch::kBFloat16).to(torch::kFloat32).abs();
  }
  if (p == 2) {
    EXPECT_TRUE(torch::equal(h, bf_sum.to(torch::kBFloat16)));
  }
  const torch::Tensor bound = bf_abs_sum * ((p - 1) * std::ldexp(1.0, -8));
  EXPECT_TRUE((h.to(torch::kFloat32) - bf_sum).abs().le(bound).all().item<bool>());

  // Ring of point-to-point messages.
  torch::Tensor incoming = torch::empty_like(all[r]);
  if (r % 2 == 0) {
    dist::send(all[r], g, (r + 1) % p);
    dist::recv(incoming, g, (r + p - 1) % p);
  } else {
    dist::recv(incoming, g, (r + p - 1) % p);
    dist::send(all[r], g, (r + 1) % p);
  }
  EXPECT_TRUE(torch::equal(incoming, all[(r + p - 1) % p]));
  EXPECT_GT(g.counters().bytes_sent, 0);

  // Accounting follows the ring algorithms: an all-reduce of n floats sends 2 (p-1)/p n 4 bytes per
  // rank, an all-gather of n floats per rank sends (p-1) n 4 bytes.
  const int64_t n = 12 * p;
  torch::Tensor ones = torch::ones({n});
  const int64_t before = g.counters().bytes_sent;
  dist::all_reduce(ones, g);
  EXPECT_EQ(g.counters().bytes_sent - before, 2 * (p - 1) * n * 4 / p);
  const int64_t mid = g.counters().bytes_sent;
  dist::all_gather(ones, g, 0);
  EXPECT_EQ(g.counters().bytes_sent - mid, (p - 1) * n * 4);
  // Broadcast from root 0 as a pipelined ring: every rank but the last (p - 1) forwards the tensor and
  // every rank but the root receives it; reduce to root 0 is the same ring backwards.
  const int64_t sent_before = g.counters().bytes_sent, received_before = g.counters().bytes_received;
  dist::broadcast(ones, g, 0);
  EXPECT_EQ(g.counters().bytes_sent - sent_before, r == p - 1 ? 0 : n * 4);
  EXPECT_EQ(g.counters().bytes_received - received_before, r == 0 ? 0 : n * 4);
  const int64_t sent_mid = g.counters().bytes_sent, received_mid = g.counters().bytes_received;
  dist::reduce(ones, g, 0);
  EXPECT_EQ(g.counters().bytes_sent - sent_mid, r == 0 ? 0 : n * 4);
  EXPECT_EQ(g.counters().bytes_received - received_mid, r == 1 ? 0 : n * 4);
}

TEST(CollectivesTest, PlainMatchSerialOnTwoRanks) {
  if (!testing::is_worker()) return run_test_on_ranks(2);
  check_plain_collectives();
}

// The sockets listening on `port` (IPv4 and IPv6), as the kernel lists them: local addresses in hex.
std::vector<std::string> listening_addresses(int port) {
  std::vector<std::string> addresses;
  char port_hex[8];
  std::snprintf(port_hex, sizeof(port_hex), "%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (state == "0A" && local.substr(colon + 1) == port_hex) addresses.push_back(local.substr(0, colon));
    }
  }
  return addresses;
}

// Before: the store listened on every interface (0.0.0.0) even for a run whose master is 127.0.0.1.
TEST(RendezvousTest, TheStoreListensOnTheMasterAddressOnly) {
  if (!testing::is_worker()) return run_test_on_ranks(2);
  auto world = testing::worker_world();
  const dist::LaunchEnv env = dist::detect_launch_env();
  ASSERT_EQ(env.master_addr, "127.0.0.1");
  if (world->rank() == 0) {
    const int port = env.master_port != 0 ? env.master_port : std::stoi(read_file(env.port_file));
    const auto addresses = listening_addresses(port);
    ASSERT_FALSE(addresses.empty()) << "no socket listens on port " << port;
    for (const auto& address : addresses) EXPECT_EQ(address, "0100007F") << "port " << port;  // 127.0.0.1
  }
  dist::barrier(*world->world_group());
}

TEST(CollectivesTest, PlainMatchSerialOnFourRanks) {
  if (!testing::is_worker()) return run_test_on_ranks(4);
  check_plain_collectives();
}

// Each autograd collective: the loss L = Σ_r <w_r, f(x)_r> over ranks, where f is the collective,
// has a gradient every rank can compute serially by autograd on the stacked inputs.
TEST(CollectivesTest, AutogradMatchesSerialGradients) {
  if (!testing::is_worker()) return run_test_on_ranks(4);
  auto world = testing::worker_world();
  auto g = world->world_group();
  const int p = g->size(), r = g->rank();
  auto inputs = [&] {
    std::vector<torch::Tensor> xs;
    for (int k = 0; k < p; ++k) xs.push_back(input_of(k, {2 * p, 2 * p}, torch::kFloat64).requires_grad_(true));
    return xs;
  };
  using Parallel = std::function<torch::Tensor(const torch::Tensor&)>;
  using Serial = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;
  struct Case {
    const char* name;
    Parallel parallel;
    Serial serial;  // every rank's output from all inputs
  };
  auto cat_dim1 = [](const std::vector<torch::Tensor>& xs) { return torch::cat(xs, 1); };
  std::vector<Case> cases = {
      {"all_reduce_sum", [&](const torch::Tensor& x) { return dist::autograd::all_reduce_sum(x, g); },
       [&](const std::vector<torch::Tensor>& xs) { return std::vector<torch::Tensor>(p, torch::stack(xs).sum(0)); }},
      {"all_gather", [&](const torch::Tensor& x) { return dist::autograd::all_gather(x, g, 1); },
       [&](const std::vector<torch::Tensor>& xs) { return std::vector<torch::Tensor>(p, cat_dim1(xs)); }},
      {"reduce_scatter", [&](const torch::Tensor& x) { return dist::autograd::reduce_scatter(x, g, 0); },
       [&](const std::vector<torch::Tensor>& xs) {
         auto parts = torch::stack(xs).sum(0).chunk(p, 0);
         return std::vector<torch::Tensor>(parts.begin(), parts.end());
       }},
      {"all_to_all", [&](const torch::Tensor& x) { return dist::autograd::all_to_all(x, g, 0, 1); },
       [&](const std::vector<torch::Tensor>& xs) {
         std::vector<torch::Tensor> outs;
         for (int dst = 0; dst < p; ++dst) {
           std::vector<torch::Tensor> parts;
           for (int src = 0; src < p; ++src) parts.push_back(xs[src].chunk(p, 0)[dst]);
           outs.push_back(torch::cat(parts, 1));
         }
         return outs;
       }},
      {"broadcast", [&](const torch::Tensor& x) { return dist::autograd::broadcast(x, g, 1); },
       [&](const std::vector<torch::Tensor>& xs) { return std::vector<torch::Tensor>(p, xs[1]); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    // Serial reference on this process.
    auto serial_inputs = inputs();
    auto outs = c.serial(serial_inputs);
    torch::Tensor serial_loss = torch::zeros({}, torch::kFloat64);
    std::vector<torch::Tensor> out_weights;
    for (int k = 0; k < p; ++k) {
      torch::manual_seed(900 + k);
      out_weights.push_back(torch::randn(outs[k].sizes(), torch::kFloat64));
      serial_loss = serial_loss + (outs[k] * out_weights[k]).sum();
    }
    serial_loss.backward();
    // Distributed: each rank holds only its own input and its own term of the loss.
    auto mine = inputs()[r];
    torch::Tensor out = c.parallel(mine);
    EXPECT_TRUE(torch::allclose(out, outs[r].detach(), 1e-12, 1e-12));
    (out * out_weights[r]).sum().backward();
    ASSERT_TRUE(mine.grad().defined());
    // An input the serial graph never used (broadcast from another root) has gradient zero.
    const torch::Tensor expected_grad =
        serial_inputs[r].grad().defined() ? serial_inputs[r].grad() : torch::zeros_like(serial_inputs[r]);
    EXPECT_TRUE(torch::allclose(mine.grad(), expected_grad, 1e-12, 1e-12))
        << "max diff " << (mine.grad() - expected_grad).abs().max().item<double>();
  }
}

// Megatron's pair: forward identity / backward all-reduce, and the reverse. With a replicated
// downstream loss counted once, copy_to_group's gradient is the sum of the ranks' gradients.
TEST(CollectivesTest, CopyAndReduceRegionsHaveConjugateGradients) {
  if (!testing::is_worker()) return run_test_on_ranks(2);
  auto world = testing::worker_world();
  auto g = world->world_group();
  const int r = g->rank();
  torch::Tensor x = torch::ones({3}, torch::kFloat64).requires_grad_(true);
  torch::Tensor y = dist::autograd::copy_to_group(x, g) * (r + 1.0);  // rank-local branch
  torch::Tensor z = dist::autograd::reduce_from_group(y, g);           // replicated: 3 x on both ranks
  EXPECT_TRUE(torch::allclose(z, torch::full({3}, 3.0, torch::kFloat64)));
  z.sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), torch::full({3}, 3.0, torch::kFloat64)));  // 1 + 2
}

TEST(CollectivesTest, AutogradSendRecvCarriesGradientBack) {
  if (!testing::is_worker()) return run_test_on_ranks(2);
  auto world = testing::worker_world();
  auto g = world->world_group();
  torch::Tensor w = torch::arange(6, torch::kFloat64).view({2, 3});
  if (g->rank() == 0) {
    torch::Tensor x = torch::randn({2, 3}, torch::kFloat64).requires_grad_(true);
    torch::Tensor token = dist::autograd::send(x * 2.0, g, 1);
    token.backward();
    EXPECT_TRUE(torch::allclose(x.grad(), 2.0 * w));  // d/dx of <w, 2x>
  } else {
    torch::Tensor y = dist::autograd::recv({2, 3}, torch::kFloat64, g, 0);
    (y * w).sum().backward();
  }
}

TEST(ProcessMeshTest, GroupsFollowRowMajorLayout) {
  if (!testing::is_worker()) return run_test_on_ranks(4);
  auto world = testing::worker_world();
  dist::ProcessMesh mesh(world, {{"data", 2}, {"tensor", 2}});
  const int r = world->rank();
  EXPECT_EQ(mesh.coordinate("data"), r / 2);
  EXPECT_EQ(mesh.coordinate("tensor"), r % 2);
  EXPECT_EQ(mesh.group("tensor")->global_ranks(), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(mesh.group("data")->global_ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
  EXPECT_EQ(mesh.group(std::vector<std::string>{"data", "tensor"})->size(), 4);
  // The tensor group really connects the right peers: a sum over it counts each pair once.
  torch::Tensor x = torch::full({1}, static_cast<float>(r));
  dist::all_reduce(x, *mesh.group("tensor"));
  EXPECT_EQ(x.item<float>(), static_cast<float>(r / 2 * 2 * 2 + 1));
  EXPECT_THROW(dist::ProcessMesh(world, {{"data", 3}}), Error);
}

TEST(ProcessMeshTest, LostPeerGivesErrorNotHang) {
  if (!testing::is_worker()) return run_test_on_ranks(2);
  dist::WorldOptions options;
  options.device = "cpu";
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(5);
  auto world = dist::World::init(dist::detect_launch_env(), options);
  if (world->rank() == 1) std::_Exit(0);  // a peer vanishes without a word
  torch::Tensor x = torch::ones({4});
  const auto start = std::chrono::steady_clock::now();
  try {
    dist::all_reduce(x, *world->world_group());
    ADD_FAILURE() << "all_reduce with a dead peer returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("process group 'world'"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

}  // namespace
}  // namespace kuafu

// Dynamic axial parallelism over real Gloo ranks: each primitive's forward and backward against the
// whole tensors built on every rank (pure data movement and sums: exact in float64, so compared to
// 1e-12), their asynchronous forms, and a toy AlphaFold-style block on a pair tensor (attention along
// rows, a triangle update that needs every row, attention along columns) against the serial block.
// The toy block also runs with FastFold's gather backward (local gradient only), which must disagree.
#include <gtest/gtest.h>

#include "core/dist/autograd_collectives.h"
#include "core/dist/collectives.h"
#include "core/parallel/dap/dap.h"
#include "tests/support/multiprocess.h"
#include "tests/support/tensor_parallel_checks.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

constexpr double kExact = 1e-12;

dist::GroupPtr dap_group() {
  static auto mesh = [] {
    auto world = testing::worker_world();
    return std::make_shared<dist::ProcessMesh>(world, std::vector<dist::MeshAxis>{{"dap", world->size()}});
  }();
  return mesh->group("dap");
}

torch::Tensor block_of(const torch::Tensor& whole, int64_t dim, int rank, int ranks) {
  return whole.chunk(ranks, dim)[rank];
}

// Every rank draws the same whole tensors (seeded), so each can build the expected results itself.
torch::Tensor shared_randn(at::IntArrayRef shape, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(shape, torch::kFloat64);
}

void primitives_match_their_definitions() {
  const auto group = dap_group();
  const int r = group->rank(), p = group->size();
  const torch::Tensor whole = shared_randn({2, 4, 8, 3}, 1);
  for (int64_t dim : {0, 1, 2, -1}) {
    if (whole.size(dim) % p != 0) continue;
    const std::string at = " along dim " + std::to_string(dim);
    // split: whole on every rank -> block; the whole tensor's gradient is every block's gradient.
    {
      const torch::Tensor weights = shared_randn(whole.sizes(), 2);
      torch::Tensor x = whole.clone().requires_grad_();
      torch::Tensor y = parallel::dap::split(x, group, dim);
      testing::expect_close(y, block_of(whole, dim, r, p), "split" + at, kExact);
      (y * block_of(weights, dim, r, p)).sum().backward();
      testing::expect_close(x.grad(), weights, "split backward" + at, kExact);
    }
    // gather: blocks -> whole; each rank uses it with its own weights, so a block's gradient sums them all.
    for (bool async : {false, true}) {
      const std::string what = std::string(async ? "gather_async" : "gather") + at;
      torch::Tensor x = block_of(whole, dim, r, p).clone().requires_grad_();
      torch::Tensor y;
      if (async) {
        auto pending = parallel::dap::gather_async(x, group, dim);
        torch::Tensor overlapped = x * 2;  // work while the transfer is in flight
        y = pending.wait() + overlapped.sum() * 0;
      } else {
        y = parallel::dap::gather(x, group, dim);
      }
      testing::expect_close(y, whole, what, kExact);
      (y * shared_randn(whole.sizes(), 100 + r)).sum().backward();
      torch::Tensor expected = torch::zeros_like(whole);
      for (int q = 0; q < p; ++q) expected += shared_randn(whole.sizes(), 100 + q);
      testing::expect_close(x.grad(), block_of(expected, dim, r, p), what + " backward", kExact);
    }
  }
  // move_cut: rows cut -> columns cut of a pair tensor [B, R, R, C], and back; gradients move back.
  const torch::Tensor pair = shared_randn({2, 8, 8, 3}, 3), weights = shared_randn({2, 8, 8, 3}, 4);
  for (bool async : {false, true}) {
    const std::string what = async ? "move_cut_async" : "row_to_col";
    torch::Tensor rows = block_of(pair, 1, r, p).clone().requires_grad_();
    torch::Tensor cols = async ? parallel::dap::move_cut_async(rows, group, 1, 2).wait() : parallel::dap::row_to_col(rows, group);
    testing::expect_close(cols, block_of(pair, 2, r, p), what, kExact);
    (cols * block_of(weights, 2, r, p)).sum().backward();
    testing::expect_close(rows.grad(), block_of(weights, 1, r, p), what + " backward", kExact);
    torch::Tensor back = parallel::dap::col_to_row(cols, group);
    testing::expect_close(back, rows, what + " then col_to_row", kExact);
  }
  // Sizes that do not divide, and dims out of range, are refused with the numbers.
  const std::string uneven = testing::error_message([&] { parallel::dap::split(torch::zeros({3, 5}), group, 1); });
  EXPECT_NE(uneven.find("dim 1 has size 5, which does not divide by the DAP group size " + std::to_string(p)),
            std::string::npos) << uneven;
  const std::string range = testing::error_message([&] { parallel::dap::gather(torch::zeros({3}), group, 2); });
  EXPECT_NE(range.find("dim 2 is out of range"), std::string::npos) << range;
}

TEST(DapTest, PrimitivesMatchTheirDefinitionsOnTwoRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  primitives_match_their_definitions();
}

TEST(DapTest, PrimitivesMatchTheirDefinitionsOnFourRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  primitives_match_their_definitions();
}

// ---- A toy two-axis block on a pair tensor z [B, N, N, C]. ----

struct ToyBlock {
  int64_t heads = 2;
  std::vector<torch::Tensor> weights;  // row qkv [C, 3C], column qkv [C, 3C], a, b, out [C, C]

  ToyBlock(int64_t c, torch::Dtype dtype) {
    torch::manual_seed(7);
    for (int64_t width : {3 * c, 3 * c, c, c, c}) {
      weights.push_back((torch::randn({c, width}, torch::kFloat64) * 0.4).to(dtype).requires_grad_());
    }
  }

  // Multi-head attention of each line of z along dim 2 (each row attends over its columns).
  torch::Tensor attention_along_rows(const torch::Tensor& z, const torch::Tensor& w_qkv) const {
    const int64_t c = z.size(3), d = c / heads;
    auto split_heads = [&](const torch::Tensor& t) {  // [B, R, L, C] -> [B, R, H, L, D]
      return t.view({t.size(0), t.size(1), t.size(2), heads, d}).permute({0, 1, 3, 2, 4});
    };
    auto qkv = torch::matmul(z, w_qkv).split(c, 3);
    torch::Tensor s = torch::matmul(split_heads(qkv[0]), split_heads(qkv[1]).transpose(-2, -1)) / std::sqrt(double(d));
    torch::Tensor out = torch::matmul(torch::softmax(s, -1), split_heads(qkv[2]));  // [B, R, H, L, D]
    return out.permute({0, 1, 3, 2, 4}).reshape(z.sizes());
  }

  // `gather_rows`: the whole of b from every rank's rows (identity when serial). `to_cols` / `to_rows`
  // move the cut between rows and columns (identity when serial).
  using Move = std::function<torch::Tensor(const torch::Tensor&)>;
  torch::Tensor forward(torch::Tensor z, const Move& gather_rows, const Move& to_cols, const Move& to_rows) const {
    z = z + attention_along_rows(z, weights[0]);  // rows are whole on each rank: local
    // Triangle update t[i, j] = Σ_k a[i, k] ⊙ b[j, k]: this rank's rows i against every row j.
    const torch::Tensor b = gather_rows(torch::matmul(z, weights[3]));
    const torch::Tensor a = torch::matmul(z, weights[2]);
    z = z + torch::matmul(torch::einsum("bikc,bjkc->bijc", {a, b}), weights[4]);
    z = to_cols(z);  // columns are whole on each rank: attention along them is local
    z = z + attention_along_rows(z.transpose(1, 2), weights[1]).transpose(1, 2);
    return to_rows(z);
  }
};

enum class GatherKind { kDap, kDapAsync, kLocalGradientOnly };

void toy_block_equals_serial(torch::Dtype dtype, GatherKind kind) {
  const auto group = dap_group();
  const int r = group->rank(), p = group->size();
  const int64_t n = 8, c = 8;
  const torch::Tensor z0 = shared_randn({1, n, n, c}, 5).to(dtype), out_weights = shared_randn({1, n, n, c}, 6).to(dtype);

  ToyBlock serial(c, dtype);
  torch::Tensor z_serial = z0.clone().requires_grad_();
  auto same = [](const torch::Tensor& t) { return t; };
  const torch::Tensor expected = serial.forward(z_serial, same, same, same);
  (expected * out_weights).sum().backward();

  ToyBlock parallel(c, dtype);
  torch::Tensor z_whole = z0.clone().requires_grad_();
  auto gather_rows = [&](const torch::Tensor& b) -> torch::Tensor {
    if (kind == GatherKind::kDap) return parallel::dap::gather(b, group, 1);
    if (kind == GatherKind::kDapAsync) return parallel::dap::gather_async(b, group, 1).wait();
    // FastFold's gather: every block arrives, but the gradient keeps only this rank's own use of its block.
    auto blocks = dist::all_gather(b.detach(), *group, 1).chunk(p, 1);
    blocks[r] = b;
    return torch::cat(blocks, 1);
  };
  auto to_cols = [&](const torch::Tensor& z) { return parallel::dap::move_cut_async(z, group, 1, 2).wait(); };
  auto to_rows = [&](const torch::Tensor& z) { return parallel::dap::col_to_row(z, group); };
  const torch::Tensor out = parallel.forward(parallel::dap::split(z_whole, group, 1), gather_rows, to_cols, to_rows);
  (out * block_of(out_weights, 1, r, p)).sum().backward();
  // Each rank holds its share of the weights' gradients: their sum is the serial gradient.
  std::vector<torch::Tensor> grads;
  for (const auto& w : parallel.weights) {
    torch::Tensor g = w.grad().clone();
    dist::all_reduce(g, *group);
    grads.push_back(g);
  }

  // Relative to each tensor's largest entry: fp64 to 1e-12; fp32 to 1e-4, since both fp32 runs round
  // (6e-8 per operation) through sums of 10^2-10^3 terms and softmax backwards that subtract nearly
  // equal terms. How far the two fp32 runs drift depends on the CPU's vector width (the summation order
  // of ATen's kernels): up to 6e-6 on one machine, 2.6e-5 on another (weight gradients at P = 4). The
  // fp64 case shows the algorithm itself is exact.
  const double relative = dtype == torch::kFloat64 ? 1e-12 : 1e-4;
  auto check = [&](const torch::Tensor& actual, const torch::Tensor& reference, const std::string& what) {
    ASSERT_EQ(actual.sizes(), reference.sizes()) << what;
    const double scale = reference.abs().max().item<double>();
    EXPECT_LE((actual - reference).abs().max().item<double>(), relative * scale) << what << " (largest entry " << scale << ")";
  };
  if (kind == GatherKind::kLocalGradientOnly) {
    const double error = (z_whole.grad() - z_serial.grad()).abs().max().item<double>();
    EXPECT_GT(error, 1e-3) << "a gather whose backward drops the other ranks' gradients must be caught";
    return;
  }
  const std::string what = std::string(kind == GatherKind::kDapAsync ? "async " : "") + "toy block, P = " +
                           std::to_string(p) + (dtype == torch::kFloat32 ? ", fp32" : ", fp64");
  check(out, block_of(expected, 1, r, p).detach(), what + ": output");
  check(z_whole.grad(), z_serial.grad(), what + ": input gradient");
  for (size_t i = 0; i < grads.size(); ++i) check(grads[i], serial.weights[i].grad(), what + ": weight " + std::to_string(i));
}

void toy_block_cases() {
  for (torch::Dtype dtype : {torch::kFloat64, torch::kFloat32}) {
    toy_block_equals_serial(dtype, GatherKind::kDap);
    toy_block_equals_serial(dtype, GatherKind::kDapAsync);
  }
  toy_block_equals_serial(torch::kFloat64, GatherKind::kLocalGradientOnly);
}

TEST(DapTest, ToyPairBlockEqualsSerialOnTwoRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  toy_block_cases();
}

TEST(DapTest, ToyPairBlockEqualsSerialOnFourRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  toy_block_cases();
}

}  // namespace
}  // namespace kuafu

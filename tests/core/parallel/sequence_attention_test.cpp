// Sequence-parallel attention over real Gloo ranks against attention written out by hand on the whole
// sequence (softmax(q kᵀ/√D + mask) v, differentiated by LibTorch's autograd), for ring self-attention,
// blockwise ring attention and all-to-all (Ulysses) attention, with and without the causal mask, on
// plain rows and on packed rows (several documents per row, each query seeing only its own document).
//
// Tolerances: float64 runs agree to 1e-12 (only the summation order differs: the online softmax
// rescales partial sums); float32 runs, whose inputs are the same numbers, agree with the float64
// reference to 2e-5 (float32 rounding, 1.2e-7 per operation, over sums of at most 16 terms of size ~1).
#include <gtest/gtest.h>

#include "core/parallel/sequence/ring_attention.h"
#include "core/parallel/sequence/sequence_parallel.h"
#include "tests/support/multiprocess.h"
#include "tests/support/tensor_parallel_checks.h"
#include "tests/support/test_util.h"
#include "tests/support/worker_world.h"

namespace kuafu {
namespace {

using parallel::sequence::SequenceMode;
using parallel::sequence::SequenceParallel;

// The reference: attention over the whole sequence, written out. `documents` [B, n]: keys of another
// document are masked out (undefined: none).
torch::Tensor reference_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                                  const torch::Tensor& documents) {
  torch::Tensor s = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (causal) {
    const int64_t n = q.size(2);
    s = s.masked_fill(torch::ones({n, n}, torch::kBool).triu(1), -std::numeric_limits<double>::infinity());
  }
  if (documents.defined()) {
    const torch::Tensor other = documents.unsqueeze(2).ne(documents.unsqueeze(1)).unsqueeze(1);  // [B, 1, n, n]
    s = s.masked_fill(other, -std::numeric_limits<double>::infinity());
  }
  return torch::matmul(torch::softmax(s, -1), v);
}

// Packed rows of 12 positions whose documents cross the chunk boundaries of 2, 3 and 4 ranks: row 0
// holds documents of 5, 4 and 3 positions, row 1 of 2, 7 and 3.
torch::Tensor packed_documents() {
  return torch::tensor({0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2}, torch::kInt64).view({2, 12});
}

struct Case {
  SequenceMode mode;
  bool causal;
  torch::Dtype dtype;
  bool packed = false;
};

std::string describe(const Case& c, int ranks) {
  const char* mode = c.mode == SequenceMode::kRing ? "blockwise ring" : c.mode == SequenceMode::kRingScores ? "ring self-attention" : "all-to-all";
  return std::string(mode) + (c.causal ? ", causal" : "") + (c.packed ? ", packed" : "") +
         (c.dtype == torch::kFloat32 ? ", fp32" : ", fp64") +
         ", P = " + std::to_string(ranks);
}

// Every rank draws the same whole q, k, v and output weights R (loss = Σ out ⊙ R), runs the parallel
// attention on its chunk and compares the output and the q, k, v gradients with its chunk of the
// reference's.
void attention_equals_serial(const SequenceParallel& sp, const Case& c, int64_t n) {
  const std::string what = describe(c, sp.size);
  torch::manual_seed(11);
  const int64_t batch = 2, heads = 4, dim = 8;
  const torch::Tensor q0 = torch::randn({batch, heads, n, dim}, torch::kFloat64).to(c.dtype).to(torch::kFloat64);
  const torch::Tensor k0 = torch::randn({batch, heads, n, dim}, torch::kFloat64).to(c.dtype).to(torch::kFloat64);
  const torch::Tensor v0 = torch::randn({batch, heads, n, dim}, torch::kFloat64).to(c.dtype).to(torch::kFloat64);
  const torch::Tensor weights = torch::randn({batch, heads, n, dim}, torch::kFloat64).to(c.dtype).to(torch::kFloat64);

  const torch::Tensor documents = c.packed ? packed_documents() : torch::Tensor();
  std::vector<torch::Tensor> whole = {q0.clone().requires_grad_(), k0.clone().requires_grad_(), v0.clone().requires_grad_()};
  const torch::Tensor expected = reference_attention(whole[0], whole[1], whole[2], c.causal, documents);
  (expected * weights).sum().backward();

  std::vector<torch::Tensor> local;
  for (const auto& t : {q0, k0, v0}) local.push_back(parallel::sequence::local_chunk(t, 2, sp).to(c.dtype).requires_grad_());
  SequenceParallel mode = sp;
  mode.mode = c.mode;
  mode.query_tile = 2;  // chunks of 3 or 6 rows: tiles with a remainder
  const torch::Tensor out = parallel::sequence::attention(local[0], local[1], local[2], c.causal, 0.0, mode, documents);
  (out * parallel::sequence::local_chunk(weights, 2, sp).to(c.dtype)).sum().backward();

  const double tolerance = c.dtype == torch::kFloat64 ? 1e-12 : 2e-5;
  testing::expect_close(out.to(torch::kFloat64), parallel::sequence::local_chunk(expected, 2, sp).detach(),
                        what + ": output", tolerance);
  const char* names[] = {"dq", "dk", "dv"};
  for (size_t i = 0; i < 3; ++i) {
    testing::expect_close(local[i].grad().to(torch::kFloat64), parallel::sequence::local_chunk(whole[i].grad(), 2, sp),
                          what + ": " + names[i], tolerance);
  }
}

void every_mode_equals_serial(int ranks) {
  auto world = testing::worker_world();
  dist::ProcessMesh mesh(world, {{"sequence", ranks}});
  SequenceParallel sp;
  sp.mode = SequenceMode::kRing;  // replaced per case
  sp.size = ranks;
  sp.group = mesh.group("sequence");
  for (SequenceMode mode : {SequenceMode::kRingScores, SequenceMode::kRing, SequenceMode::kAllToAll}) {
    for (bool causal : {false, true}) {
      for (torch::Dtype dtype : {torch::kFloat64, torch::kFloat32}) attention_equals_serial(sp, {mode, causal, dtype}, 12);
      attention_equals_serial(sp, {mode, causal, torch::kFloat64, /*packed=*/true}, 12);
    }
  }
}

TEST(SequenceAttentionTest, EveryModeEqualsSerialOnTwoRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  every_mode_equals_serial(2);
}

TEST(SequenceAttentionTest, EveryModeEqualsSerialOnFourRanks) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(4);
  every_mode_equals_serial(4);
}

// One rank: the online softmax over query tiles alone, against the reference, in a process of its own.
TEST(SequenceAttentionTest, BlockwiseOnOneRankEqualsSerial) {
  auto world = dist::World::single();
  SequenceParallel sp;
  sp.size = 1;
  sp.group = world->world_group();
  for (bool causal : {false, true}) attention_equals_serial(sp, {SequenceMode::kRing, causal, torch::kFloat64}, 7);
}

TEST(SequenceAttentionTest, UnevenLengthsAndHeadsAreRefused) {
  if (!testing::is_worker()) return testing::run_test_on_ranks(2);
  auto world = testing::worker_world();
  dist::ProcessMesh mesh(world, {{"sequence", 2}});
  SequenceParallel sp;
  sp.mode = SequenceMode::kRing;
  sp.size = 2;
  sp.group = mesh.group("sequence");
  const std::string length = testing::error_message([&] { parallel::sequence::local_chunk(torch::zeros({1, 9}), 1, sp); });
  EXPECT_NE(length.find("9 positions cannot be cut into 2 equal chunks"), std::string::npos) << length;
  // Three heads cannot be shared by two ranks in all-to-all attention (checked before any transfer).
  const torch::Tensor q = torch::zeros({1, 3, 4, 2});
  const std::string heads = testing::error_message([&] { parallel::sequence::all_to_all_attention(q, q, q, sp.group, false); });
  EXPECT_NE(heads.find("attention heads (3) to divide by the sequence-parallel size (2)"), std::string::npos) << heads;
  const std::string dropout = testing::error_message([&] { parallel::sequence::attention(q, q, q, true, 0.1, sp); });
  EXPECT_NE(dropout.find("no attention-probability dropout"), std::string::npos) << dropout;
}

}  // namespace
}  // namespace kuafu

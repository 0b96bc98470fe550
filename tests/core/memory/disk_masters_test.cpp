// Gemini's master chunks on the disk tier (core/memory/disk_masters.h): records and gradients hold no
// memory between uses, and views taken of them before see their values whenever they are brought back;
// a stream of the chunks reads the next one while the current one is used and writes each back, holding
// no more than the stated number of chunks at once; gradients read back what was written and start from
// zeros after forget_gradients; a disk budget too small is an error naming its key.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/memory/disk_masters.h"
#include "tests/support/test_util.h"

namespace kuafu::memory {
namespace {
namespace fs = std::filesystem;

DiskTierOptions options_in(const std::string& name, int64_t budget = 0) {
  const fs::path dir = testing::temp_dir("disk_masters_" + name);
  fs::create_directories(dir);
  DiskTierOptions options;
  options.dir = dir.string();
  options.budget_bytes = budget;
  return options;
}

// Chunk c's record [3 n] (a master and two state slots) of values no other chunk has; n varies by chunk and
// is not a multiple of O_DIRECT's 4 KiB.
torch::Tensor record_of(int64_t c) { return torch::arange(3 * (1000 + 37 * c), torch::kFloat32) + 1e4f * c; }

TEST(DiskMastersTest, RecordsAndGradientsComeBackThroughTheirViews) {
  DiskMasters masters(options_in("views"));
  const int64_t chunks = 5;
  std::vector<torch::Tensor> records, grads, master_views;
  int64_t largest_record = 0, largest_grad = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    records.push_back(record_of(c));
    grads.push_back(torch::zeros({1000 + 37 * c}));
    master_views.push_back(records[c].narrow(0, 0, 1000 + 37 * c));  // taken while the memory is there
    largest_record = std::max<int64_t>(largest_record, records[c].numel() * 4);
    largest_grad = std::max<int64_t>(largest_grad, grads[c].numel() * 4);
    masters.adopt(c, records[c], grads[c]);
  }
  masters.settle();
  EXPECT_EQ(masters.host_bytes(), 0);
  for (int64_t c = 0; c < chunks; ++c) EXPECT_EQ(records[c].storage().nbytes(), 0u) << "chunk " << c;

  // A backward adds to each gradient twice: the second add reads back the first.
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t c = 0; c < chunks; ++c) {
      masters.bring_gradient(c);
      grads[c].add_(static_cast<float>(c + 1));
      masters.send_gradient(c);
    }
  }
  // The step's stream: every record and gradient as written, the next chunk already coming in, the
  // records changed and written back.
  std::vector<int64_t> seen;
  masters.for_each(/*gradients=*/true, /*changed=*/true, [&](int64_t c) {
    seen.push_back(c);
    EXPECT_TRUE(torch::equal(records[c], record_of(c))) << "chunk " << c;
    EXPECT_TRUE(torch::equal(grads[c], torch::full_like(grads[c], 2.0f * (c + 1)))) << "chunk " << c;
    if (c + 1 < chunks) {
      EXPECT_GT(records[c + 1].storage().nbytes(), 0u) << "chunk " << c + 1 << " was not read ahead";
    }
    master_views[c].mul_(-1);
  });
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_LE(masters.peak_host_bytes(), DiskMasters::most_host_bytes(largest_record, largest_grad));
  masters.settle();
  EXPECT_EQ(masters.host_bytes(), 0);

  // zero_grad: gradients are zeros again without a read; the changed masters come back through the views.
  masters.forget_gradients();
  masters.for_each(/*gradients=*/true, /*changed=*/false, [&](int64_t c) {
    EXPECT_TRUE(torch::equal(grads[c], torch::zeros_like(grads[c]))) << "chunk " << c;
    torch::Tensor expected = record_of(c);
    expected.narrow(0, 0, 1000 + 37 * c).mul_(-1);
    EXPECT_TRUE(torch::equal(records[c], expected)) << "chunk " << c;
  });
  // A checkpoint's way: one chunk opened at a time, changed and closed, read back.
  for (int64_t c = 0; c < chunks; ++c) {
    masters.open(c);
    EXPECT_FLOAT_EQ(master_views[c][1].item<float>(), -(1.0f + 1e4f * c));
    master_views[c][1] = 7.0f;
    masters.close(c, /*changed=*/true);
  }
  masters.settle();
  EXPECT_EQ(masters.host_bytes(), 0);
  masters.open(3);
  EXPECT_FLOAT_EQ(master_views[3][1].item<float>(), 7.0f);
  masters.close(3, /*changed=*/false);
  EXPECT_EQ(masters.host_bytes(), 0);
}

// A placement taking chunks off the disk: one whose gradient was just written (its write may still be going
// on), one whose gradient is zeros (no file), one open for a checkpoint's change: each comes back in memory
// with its values, stays there (the tier no longer counts it or streams it), and its files go.
TEST(DiskMastersTest, AChunkTakenBackStaysInMemoryWithItsValues) {
  const DiskTierOptions options = options_in("take_back");
  DiskMasters masters(options);
  std::vector<torch::Tensor> records, grads;
  for (int64_t c = 0; c < 4; ++c) {
    records.push_back(record_of(c));
    grads.push_back(torch::zeros({1000 + 37 * c}));
    masters.adopt(c, records[c], grads[c]);
  }
  masters.settle();
  const int64_t files_before = masters.disk().bytes_held();
  masters.bring_gradient(1);
  grads[1].add_(3.0f);
  masters.send_gradient(1);
  masters.take_back(1);
  masters.take_back(2);
  masters.open(3);
  records[3][0] = -5.0f;
  masters.take_back(3);
  masters.settle();
  EXPECT_EQ(masters.chunks(), 1);
  EXPECT_FALSE(masters.holds(1));
  EXPECT_EQ(masters.host_bytes(), 0);  // what came back belongs to its tensors now
  EXPECT_LT(masters.disk().bytes_held(), files_before);
  EXPECT_TRUE(torch::equal(records[1], record_of(1)));
  EXPECT_TRUE(torch::equal(grads[1], torch::full_like(grads[1], 3.0f)));
  EXPECT_TRUE(torch::equal(records[2], record_of(2)));
  EXPECT_TRUE(torch::equal(grads[2], torch::zeros_like(grads[2])));
  EXPECT_EQ(records[3][0].item<float>(), -5.0f);
  // The stream and forget_gradients pass them by; their memory stays.
  std::vector<int64_t> seen;
  masters.for_each(/*gradients=*/true, /*changed=*/true, [&](int64_t c) { seen.push_back(c); });
  masters.forget_gradients();
  masters.settle();
  EXPECT_EQ(seen, (std::vector<int64_t>{0}));
  for (int64_t c = 1; c < 4; ++c) EXPECT_GT(records[c].storage().nbytes(), 0u) << "chunk " << c;
  EXPECT_TRUE(torch::equal(grads[1], torch::full_like(grads[1], 3.0f)));
  EXPECT_THROW(masters.take_back(1), std::exception);
}

TEST(DiskMastersTest, ABudgetTooSmallNamesItsKey) {
  DiskMasters masters(options_in("budget", /*budget=*/4096));
  torch::Tensor record = record_of(3), grad = torch::zeros({1111});
  const std::string message = testing::error_message([&] {
    masters.adopt(0, record, grad);
    masters.settle();
  });
  EXPECT_NE(message.find("memory.disk_budget_gb"), std::string::npos) << message;
}

}  // namespace
}  // namespace kuafu::memory

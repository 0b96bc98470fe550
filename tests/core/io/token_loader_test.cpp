// Training windows: each is a contiguous slice of the file with targets shifted by one, the draw is
// reproducible from (seed, step, row), and ranks' row ranges tile the global batch exactly.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/io/token_loader.h"
#include "core/util/error.h"

namespace kuafu::io {
namespace {

std::shared_ptr<const TokenFile> counting_file() {
  const auto path = std::filesystem::temp_directory_path() / ("kuafu_loader_" + std::to_string(::getpid()) + ".tok");
  std::vector<uint32_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i % 1000);
  write_token_file(path.string(), tokens, 1000);
  return std::make_shared<const TokenFile>(TokenFile::open(path.string()));
}

TEST(TokenLoaderTest, WindowsAreShiftedSlicesAndReproducible) {
  auto file = counting_file();
  TokenWindowLoader loader(file, /*context=*/16, /*seed=*/3);
  const TokenBatch batch = loader.train_batch(/*step=*/5, /*first_row=*/0, /*rows=*/8);
  ASSERT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{8, 16}));
  for (int64_t r = 0; r < 8; ++r) {
    const uint64_t start = loader.train_offset(5, r);
    EXPECT_LE(start + 17, file->size());
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(batch.inputs[r][t].item<int64_t>(), static_cast<int64_t>((start + t) % 1000));
      EXPECT_EQ(batch.targets[r][t].item<int64_t>(), static_cast<int64_t>((start + t + 1) % 1000));
    }
  }
  // Same seed and step: same windows; another step or seed: different ones.
  EXPECT_TRUE(torch::equal(batch.inputs, TokenWindowLoader(file, 16, 3).train_batch(5, 0, 8).inputs));
  EXPECT_FALSE(torch::equal(batch.inputs, loader.train_batch(6, 0, 8).inputs));
  EXPECT_FALSE(torch::equal(batch.inputs, TokenWindowLoader(file, 16, 4).train_batch(5, 0, 8).inputs));
}

TEST(TokenLoaderTest, RankSharesTileTheGlobalBatch) {
  TokenWindowLoader loader(counting_file(), 16, 9);
  const torch::Tensor global = loader.train_batch(2, 0, 12).inputs;
  for (int ranks : {2, 3, 4}) {
    std::vector<torch::Tensor> shares;
    for (int r = 0; r < ranks; ++r) shares.push_back(loader.train_batch(2, r * 12 / ranks, 12 / ranks).inputs);
    EXPECT_TRUE(torch::equal(torch::cat(shares), global)) << ranks << " ranks";
  }
}

TEST(TokenLoaderTest, EvaluationWindowsSpanTheFile) {
  auto file = counting_file();
  TokenWindowLoader loader(file, 16, 0);
  const TokenBatch all = loader.eval_batch(/*total=*/5, 0, 5);
  EXPECT_EQ(all.inputs[0][0].item<int64_t>(), 0);
  EXPECT_EQ(all.targets[4][15].item<int64_t>(), static_cast<int64_t>((file->size() - 1) % 1000));  // last token
  EXPECT_TRUE(torch::equal(loader.eval_batch(5, 3, 2).inputs, all.inputs.narrow(0, 3, 2)));
  EXPECT_THROW(TokenWindowLoader(file, 5000, 0), Error);
}

}  // namespace
}  // namespace kuafu::io

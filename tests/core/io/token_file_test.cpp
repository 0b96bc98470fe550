#include "core/io/token_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/util/error.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {

namespace fs = std::filesystem;

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "kuafu_token_file_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string read_bytes(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void write_bytes(const std::string& file, const std::string& bytes) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  }

  static std::string error_of(const std::function<void()>& action) { return testing::error_message(action); }

  fs::path dir_;
};

TEST_F(TokenFileTest, RoundTripTwoBytes) {
  const std::vector<uint32_t> tokens = {0, 1, 65534, 7, 300, 7};
  write_token_file(path("a.tok"), tokens, 65535);
  EXPECT_EQ(fs::file_size(path("a.tok")), 32u + 2 * tokens.size());

  const TokenFile file = TokenFile::open(path("a.tok"));
  EXPECT_EQ(file.bytes_per_token(), 2u);
  EXPECT_EQ(file.vocab_size(), 65535u);
  ASSERT_EQ(file.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(file.at(i), tokens[i]) << "index " << i;

  std::vector<int64_t> window(3, -1);
  file.copy_window(2, 3, window.data());
  EXPECT_EQ(window, (std::vector<int64_t>{65534, 7, 300}));
}

TEST_F(TokenFileTest, RoundTripFourBytes) {
  const std::vector<uint32_t> tokens = {65535, 0, 99999, 4000000000u};
  write_token_file(path("b.tok"), tokens, 4000000001ull);
  EXPECT_EQ(fs::file_size(path("b.tok")), 32u + 4 * tokens.size());

  const TokenFile file = TokenFile::open(path("b.tok"));
  EXPECT_EQ(file.bytes_per_token(), 4u);
  EXPECT_EQ(file.vocab_size(), 4000000001ull);
  ASSERT_EQ(file.size(), tokens.size());
  std::vector<int64_t> window(4, -1);
  file.copy_window(0, 4, window.data());
  EXPECT_EQ(window, (std::vector<int64_t>{65535, 0, 99999, 4000000000ll}));
}

TEST_F(TokenFileTest, HeaderLayoutIsLittleEndian) {
  write_token_file(path("h.tok"), {258}, 300);
  const std::string bytes = read_bytes(path("h.tok"));
  ASSERT_EQ(bytes.size(), 34u);
  EXPECT_EQ(bytes.substr(0, 8), "KUAFUTOK");
  EXPECT_EQ(bytes.substr(8, 4), std::string("\x01\0\0\0", 4));                  // version 1
  EXPECT_EQ(bytes.substr(12, 4), std::string("\x02\0\0\0", 4));                 // 2 bytes per token
  EXPECT_EQ(bytes.substr(16, 8), std::string("\x2c\x01\0\0\0\0\0\0", 8));       // vocab 300
  EXPECT_EQ(bytes.substr(24, 8), std::string("\x01\0\0\0\0\0\0\0", 8));         // 1 token
  EXPECT_EQ(bytes.substr(32, 2), std::string("\x02\x01", 2));                   // 258
}

TEST_F(TokenFileTest, EmptyFileOpens) {
  write_token_file(path("empty.tok"), {}, 10);
  const TokenFile file = TokenFile::open(path("empty.tok"));
  EXPECT_EQ(file.size(), 0u);
  EXPECT_EQ(file.histogram(), std::vector<uint64_t>(10, 0));
  EXPECT_NE(error_of([&] { unigram_entropy_nats(file); }).find("empty"), std::string::npos);
}

TEST_F(TokenFileTest, HistogramCountsEveryId) {
  write_token_file(path("h.tok"), {3, 1, 3, 3, 0}, 5);
  const TokenFile file = TokenFile::open(path("h.tok"));
  EXPECT_EQ(file.histogram(), (std::vector<uint64_t>{1, 1, 0, 3, 0}));
}

TEST_F(TokenFileTest, EntropyOfHandWorkedExample) {
  // {0, 0, 1, 2}: p = 1/2, 1/4, 1/4, so H = 1/2 ln 2 + 2 * (1/4 ln 4) = 1/2 ln 2 + ln 2 = 1.5 ln 2.
  write_token_file(path("e.tok"), {0, 0, 1, 2}, 8);
  EXPECT_NEAR(unigram_entropy_nats(TokenFile::open(path("e.tok"))), 1.5 * std::log(2.0), 1e-12);

  // A single repeated id carries no information.
  write_token_file(path("z.tok"), {5, 5, 5}, 8);
  EXPECT_EQ(unigram_entropy_nats(TokenFile::open(path("z.tok"))), 0.0);
}

// Found by fuzz_token_file (fuzz/corpus/token_file/oom-vocab-beyond-tokens): the entropy of a file of a
// few tokens whose header claims a huge vocabulary allocated a counter per id (8 GiB for 2^30 ids).
TEST_F(TokenFileTest, EntropyOfAFewTokensOfAHugeVocabularyCountsOnlyTheTokens) {
  write_token_file(path("wide.tok"), {7, 7, 4000000000u}, uint64_t{1} << 32);
  const double third = 1.0 / 3.0;
  EXPECT_NEAR(unigram_entropy_nats(TokenFile::open(path("wide.tok"))),
              -(2 * third * std::log(2 * third) + third * std::log(third)), 1e-12);
  // Unchecked ids are still refused by name on this path.
  write_token_file(path("bad.tok"), {7, 9}, 10);
  std::string bytes = read_bytes(path("bad.tok"));
  bytes[16] = 8;  // vocab size 8 < 9, but also > the two tokens
  write_bytes(path("bad.tok"), bytes);
  EXPECT_NE(error_of([&] { unigram_entropy_nats(TokenFile::open(path("bad.tok"), false)); })
                .find("token 9 at index 1 >= vocab size 8"),
            std::string::npos);
}

TEST_F(TokenFileTest, WriteRejectsIdOutsideVocab) {
  const std::string message = error_of([&] { write_token_file(path("bad.tok"), {1, 2, 4096}, 4096); });
  EXPECT_NE(message.find("token 4096 at index 2 >= vocab size 4096"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(path("bad.tok")));
  EXPECT_FALSE(fs::exists(path("bad.tok.tmp")));
}

TEST_F(TokenFileTest, OpenRejectsIdOutsideVocab) {
  write_token_file(path("ids.tok"), {1, 2, 3}, 10);
  std::string bytes = read_bytes(path("ids.tok"));
  bytes[32 + 2 * 1] = 70;  // token at index 1 becomes 70
  write_bytes(path("ids.tok"), bytes);
  const std::string message = error_of([&] { TokenFile::open(path("ids.tok")); });
  EXPECT_NE(message.find("token 70 at index 1 >= vocab size 10"), std::string::npos) << message;
  EXPECT_NE(message.find(path("ids.tok")), std::string::npos) << message;

  // Skipping the check on open still leaves histogram() safe.
  const TokenFile unchecked = TokenFile::open(path("ids.tok"), /*check_ids=*/false);
  EXPECT_NE(error_of([&] { unchecked.histogram(); }).find("token 70 at index 1"), std::string::npos);
}

TEST_F(TokenFileTest, AtAndWindowAreBoundsChecked) {
  write_token_file(path("w.tok"), {1, 2, 3}, 10);
  const TokenFile file = TokenFile::open(path("w.tok"));
  EXPECT_NE(error_of([&] { file.at(3); }).find("out of range"), std::string::npos);
  std::vector<int64_t> out(4);
  EXPECT_NE(error_of([&] { file.copy_window(1, 3, out.data()); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { file.copy_window(UINT64_MAX, 2, out.data()); }).find("out of range"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { file.copy_window(3, 0, out.data()); }), "");
}

TEST_F(TokenFileTest, TruncatedFileNamesBothSizes) {
  write_token_file(path("t.tok"), std::vector<uint32_t>(1000, 7), 4096);
  std::string bytes = read_bytes(path("t.tok"));
  write_bytes(path("t.tok"), bytes.substr(0, 1234));
  const std::string message = error_of([&] { TokenFile::open(path("t.tok")); });
  EXPECT_NE(message.find("header says 1000 tokens (2032 bytes) but the file has 1234 bytes"), std::string::npos)
      << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find(path("t.tok")), std::string::npos) << message;

  write_bytes(path("t.tok"), bytes.substr(0, 10));
  EXPECT_NE(error_of([&] { TokenFile::open(path("t.tok")); }).find("has 10 bytes, less than the 32-byte header"),
            std::string::npos);
}

// Found by fuzz_token_file (fuzz/corpus/token_file/crash-count-beyond-64-bits): a token count whose byte
// size does not fit in 64 bits reached a float-to-integer conversion out of range (undefined behaviour).
TEST_F(TokenFileTest, ATokenCountBeyond64BitsOfBytesIsNamed) {
  std::string bytes = std::string("KUAFUTOK") + std::string(24, '\0') + std::string(12, '\0');
  bytes[8] = 1;                                    // version
  bytes[12] = 4;                                   // bytes per token
  bytes[16] = 10;                                  // vocab size
  for (int i = 24; i < 32; ++i) bytes[i] = '\xff';  // 2^64 - 1 tokens
  write_bytes(path("huge.tok"), bytes);
  const std::string message = error_of([&] { TokenFile::open(path("huge.tok")); });
  EXPECT_NE(message.find("header says 18446744073709551615 tokens (more than 2^64 bytes) but the file has 44 bytes"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(path("huge.tok")), std::string::npos) << message;
}

// Before: truncating the file in place while it was mapped killed the reader with SIGBUS, no message.
TEST_F(TokenFileTest, AFileTruncatedWhileMappedFailsWithItsName) {
  write_token_file(path("live.tok"), std::vector<uint32_t>(100000, 7), 4096);
  const TokenFile file = TokenFile::open(path("live.tok"));
  std::vector<int64_t> out(1000);
  file.copy_window(90000, 1000, out.data());
  fs::resize_file(path("live.tok"), 4096);  // another program rewrites it in place
  const std::string message = error_of([&] { file.copy_window(90000, 1000, out.data()); });
  EXPECT_NE(message.find(path("live.tok")), std::string::npos) << message;
  EXPECT_NE(message.find("shrank while training read it (mapped 200032 bytes, now 4096 bytes)"), std::string::npos)
      << message;
  // What is still there reads as before, and another SIGBUS-free copy works again.
  file.copy_window(0, 100, out.data());
  EXPECT_EQ(out[0], 7);
}

TEST_F(TokenFileTest, TrailingBytesAreRejected) {
  write_token_file(path("g.tok"), {1, 2}, 10);
  write_bytes(path("g.tok"), read_bytes(path("g.tok")) + "x");
  EXPECT_NE(error_of([&] { TokenFile::open(path("g.tok")); }).find("trailing"), std::string::npos);
}

TEST_F(TokenFileTest, BadMagicIsReported) {
  write_bytes(path("m.tok"), std::string("NOTATOKF") + std::string(24, '\0'));
  const std::string message = error_of([&] { TokenFile::open(path("m.tok")); });
  EXPECT_NE(message.find("expected magic KUAFUTOK, found \"NOTATOKF\""), std::string::npos) << message;
}

TEST_F(TokenFileTest, UnsupportedVersionIsReported) {
  write_token_file(path("v.tok"), {1}, 10);
  std::string bytes = read_bytes(path("v.tok"));
  bytes[8] = 2;
  write_bytes(path("v.tok"), bytes);
  const std::string message = error_of([&] { TokenFile::open(path("v.tok")); });
  EXPECT_NE(message.find("unsupported format version 2"), std::string::npos) << message;
}

TEST_F(TokenFileTest, MissingFileNamesPath) {
  const std::string message = error_of([&] { TokenFile::open(path("nope.tok")); });
  EXPECT_NE(message.find(path("nope.tok")), std::string::npos) << message;
  EXPECT_NE(message.find("No such file"), std::string::npos) << message;
}

// Before: a folder opened, and mapping it failed with "cannot mmap token file ...: No such device".
TEST_F(TokenFileTest, AFolderIsNamedAsAFolder) {
  fs::create_directories(path("train.tok"));
  const std::string message = error_of([&] { TokenFile::open(path("train.tok")); });
  EXPECT_NE(message.find("token file " + path("train.tok") + " is a folder, not a file"), std::string::npos)
      << message;
}

TEST_F(TokenFileTest, AtomicWriteReplacesAndLeavesNoTmp) {
  write_token_file(path("x.tok"), {1, 2, 3}, 10);
  write_token_file(path("x.tok"), {4, 5}, 10);
  EXPECT_FALSE(fs::exists(path("x.tok.tmp")));
  const TokenFile file = TokenFile::open(path("x.tok"));
  ASSERT_EQ(file.size(), 2u);
  EXPECT_EQ(file.at(0), 4u);

  // A failed rename (target is a directory) cleans up its temporary too.
  fs::create_directory(path("dir.tok"));
  EXPECT_NE(error_of([&] { write_token_file(path("dir.tok"), {1}, 10); }).find("cannot rename"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path("dir.tok.tmp")));
}

TEST_F(TokenFileTest, MoveTransfersTheMapping) {
  write_token_file(path("mv.tok"), {9, 8}, 10);
  TokenFile a = TokenFile::open(path("mv.tok"));
  TokenFile b = std::move(a);
  EXPECT_EQ(b.size(), 2u);
  EXPECT_EQ(b.at(1), 8u);
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  TokenFile c = TokenFile::open(path("mv.tok"));
  c = std::move(b);
  EXPECT_EQ(c.at(0), 9u);
}

}  // namespace
}  // namespace kuafu::io

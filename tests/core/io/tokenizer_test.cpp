#include "core/io/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/util/error.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {

namespace fs = std::filesystem;

constexpr int kVocab = 400;  // 256 byte pieces + specials + newline + a hundred-odd merges

// A few thousand lines of deterministic pseudo-English; ASCII only, so anything else is unseen.
std::string generated_text() {
  const std::vector<std::string> words = {
      "the", "and", "of", "to", "in", "a", "he", "said", "unto", "them", "land", "river", "king",
      "people", "went", "came", "city", "house", "water", "light", "day", "night", "good", "great",
      "men", "children", "over", "upon", "all", "which", "was", "were", "shall", "be", "is", "not"};
  const char* endings[] = {".", ".", ";", ":", "?", "!", ","};
  uint32_t state = 12345;
  const auto next = [&state](uint32_t n) {
    state = state * 1664525u + 1013904223u;
    return (state >> 8) % n;
  };
  std::string text;
  for (int line = 0; line < 3000; ++line) {
    const uint32_t length = 4 + next(10);
    for (uint32_t w = 0; w < length; ++w) {
      std::string word = words[next(static_cast<uint32_t>(words.size()))];
      if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
      text += word;
      text += w + 1 == length ? endings[next(7)] : (next(6) == 0 ? ", " : " ");
    }
    text += '\n';
  }
  return text;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string pattern = (fs::temp_directory_path() / "kuafu_tokenizer_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = new fs::path(pattern);
    const std::string input = (*dir_ / "train.txt").string();
    std::ofstream(input) << generated_text();

    TokenizerTrainOptions options;
    options.input_path = input;
    options.model_prefix = (*dir_ / "tok").string();
    options.vocab_size = kVocab;
    train_tokenizer(options);
    tokenizer_ = new Tokenizer(Tokenizer::load(options.model_prefix + ".model"));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
    fs::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }

  // A failed training in SetUpTestSuite must fail each test, not crash it.
  void SetUp() override { ASSERT_NE(tokenizer_, nullptr) << "tokenizer training failed"; }

  static const Tokenizer& tok() { return *tokenizer_; }

  static std::string error_of(const std::function<void()>& action) { return testing::error_message(action); }

  static fs::path* dir_;
  static Tokenizer* tokenizer_;
};

fs::path* TokenizerTest::dir_ = nullptr;
Tokenizer* TokenizerTest::tokenizer_ = nullptr;

TEST_F(TokenizerTest, VocabAndSpecialIds) {
  EXPECT_EQ(tok().vocab_size(), kVocab);
  EXPECT_EQ(tok().bos_id(), kBosId);
  EXPECT_EQ(tok().eos_id(), kEosId);
  EXPECT_TRUE(fs::exists(*dir_ / "tok.vocab"));
}

TEST_F(TokenizerTest, RoundTripsTrainingLikeText) {
  const std::string text = "And the king said unto them, Go over the river.\nThe people came upon the city!\n";
  const auto ids = tok().encode(text);
  EXPECT_EQ(tok().decode(ids), text);
  // Learned merges: far fewer tokens than bytes.
  EXPECT_LT(ids.size(), text.size() / 2);
}

TEST_F(TokenizerTest, RoundTripsMultiLineTextExactly) {
  const std::string text =
      "First line.\n\nAfter a blank line:  two spaces,\ttab; \"quotes\" & (brackets) [ok] {x} 42%\n"
      "  leading spaces\ntrailing spaces   \n\n\nUnicode: naïve café, Ωμέγα, 日本語, emoji 🙂.\r\n"
      "Unseen ASCII: ~`^|\\@#$*+=<>_\n";
  const auto ids = tok().encode(text);
  EXPECT_EQ(tok().decode(ids), text);
  for (const uint32_t id : ids) {
    EXPECT_LT(id, static_cast<uint32_t>(kVocab));
    EXPECT_NE(id, static_cast<uint32_t>(kUnkId)) << "byte fallback should leave nothing unknown";
  }
}

TEST_F(TokenizerTest, NewlineIsOneTokenAndDecodingConcatenates) {
  const auto newline = tok().encode("\n");
  ASSERT_EQ(newline.size(), 1u);
  EXPECT_EQ(tok().encode("\n\n"), (std::vector<uint32_t>{newline[0], newline[0]}));

  // No dummy prefix: decoding any split of the ids gives the pieces of the text.
  const std::string text = "The light was good.\nAnd the night came.";
  const auto ids = tok().encode(text);
  const auto cut = std::find(ids.begin(), ids.end(), newline[0]);
  ASSERT_NE(cut, ids.end());
  EXPECT_EQ(tok().decode({ids.begin(), cut + 1}), "The light was good.\n");
  EXPECT_EQ(tok().decode({cut + 1, ids.end()}), "And the night came.");
}

TEST_F(TokenizerTest, EmptyTextIsNoTokens) {
  EXPECT_TRUE(tok().encode("").empty());
  EXPECT_EQ(tok().decode({}), "");
}

TEST_F(TokenizerTest, DecodeRejectsIdOutsideVocab) {
  const std::string message = error_of([] { tok().decode({5, static_cast<uint32_t>(kVocab)}); });
  EXPECT_NE(message.find("id 400 at index 1 >= vocab size 400"), std::string::npos) << message;
}

TEST_F(TokenizerTest, MissingModelNamesPath) {
  const std::string path = (*dir_ / "missing.model").string();
  const std::string message = error_of([&] { Tokenizer::load(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
}

TEST_F(TokenizerTest, CorruptModelNamesPath) {
  const std::string path = (*dir_ / "corrupt.model").string();
  std::ofstream(path) << "this is not a protobuf";
  const std::string message = error_of([&] { Tokenizer::load(path); });
  EXPECT_NE(message.find("cannot load tokenizer model " + path), std::string::npos) << message;
}

// Before: a folder given as the model was said not to exist.
TEST_F(TokenizerTest, AFolderGivenAsTheModelIsNamedAsAFolder) {
  const std::string path = (*dir_ / "model_dir").string();
  fs::create_directories(path);
  const std::string message = error_of([&] { Tokenizer::load(path); });
  EXPECT_NE(message.find("tokenizer model " + path + " is a folder, not a SentencePiece model file"),
            std::string::npos)
      << message;
}

// Before: SentencePiece's own text, "unk is not defined" for an empty file and a line of its source
// ("sentencepiece_processor.cc(1101) [model_proto->ParseFromArray(...)]") for a truncated one.
TEST_F(TokenizerTest, EmptyOrTruncatedModelSaysWhatIsWrongWithTheFile) {
  const std::string empty = (*dir_ / "empty.model").string();
  std::ofstream(empty).close();
  std::string message = error_of([&] { Tokenizer::load(empty); });
  EXPECT_NE(message.find("tokenizer model " + empty + " is empty"), std::string::npos) << message;
  std::ifstream model(*dir_ / "tok.model", std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(model)), std::istreambuf_iterator<char>());
  const std::string truncated = (*dir_ / "truncated.model").string();
  std::ofstream(truncated, std::ios::binary) << whole.substr(0, whole.size() / 2);
  message = error_of([&] { Tokenizer::load(truncated); });
  EXPECT_NE(message.find("cannot load tokenizer model " + truncated + " (" + std::to_string(whole.size() / 2) +
                         " bytes): it is not a SentencePiece model (truncated"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find(".cc("), std::string::npos) << message;
}

TEST_F(TokenizerTest, TrainingErrorsAreKuafuErrors) {
  TokenizerTrainOptions options;
  options.input_path = (*dir_ / "no_such_input.txt").string();
  options.model_prefix = (*dir_ / "never").string();
  EXPECT_NE(error_of([&] { train_tokenizer(options); }).find("no_such_input.txt"), std::string::npos);

  // With byte fallback the vocab cannot be smaller than the 256 byte pieces.
  options.input_path = (*dir_ / "train.txt").string();
  options.vocab_size = 100;
  EXPECT_NE(error_of([&] { train_tokenizer(options); }).find("failed"), std::string::npos);
  EXPECT_FALSE(fs::exists(*dir_ / "never.model"));
}

TEST_F(TokenizerTest, MoveKeepsTheModel) {
  Tokenizer moved = Tokenizer::load((*dir_ / "tok.model").string());
  Tokenizer other = std::move(moved);
  EXPECT_EQ(other.vocab_size(), kVocab);
  EXPECT_EQ(other.decode(other.encode("good day\n")), "good day\n");
}

}  // namespace
}  // namespace kuafu::io

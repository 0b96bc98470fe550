// Instruction examples: which tokens the loss learns (responses and their EOS only), one BOS, the
// messages form, skipped long examples, and bad lines named by file:line. The tokenizer is a tiny
// byte-level BPE whose every byte is a token, so each character is one id: the expected ids are the
// text's own characters, worked out by hand.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/io/instruction_data.h"
#include "tests/support/byte_tokenizer.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {
namespace fs = std::filesystem;

BpeTokenizer byte_tokenizer(const fs::path& dir) { return testing::write_byte_tokenizer(dir); }

std::vector<int64_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

TEST(InstructionDataTest, OnlyTheResponseAndItsEosAreLearned) {
  const fs::path dir = testing::temp_dir("instructions");
  const BpeTokenizer tokenizer = byte_tokenizer(dir);
  InstructionFormat format;
  format.bos = 2, format.eos = 2;  // OPT: "</s>" is both, and padding would often be the same id too
  std::ofstream(dir / "a.jsonl") << R"({"prompt": "Hi?", "response": "Yo."})" << "\n\n"
                                 << R"({"prompt": "</s>Q", "response": "A"})" << "\n";
  const InstructionSet set = read_instructions((dir / "a.jsonl").string(), tokenizer, format);
  ASSERT_EQ(set.examples.size(), 2u);
  // BOS, "Hi?\n" (not learned), "Yo." and EOS (learned).
  std::vector<int64_t> expected = {2};
  for (int64_t id : bytes_of("Hi?\nYo.")) expected.push_back(id);
  expected.push_back(2);
  EXPECT_EQ(set.examples[0].tokens, expected);
  EXPECT_EQ(set.examples[0].learned, (std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(set.examples[0].learned_count(), 4);
  // A prompt that starts with the BOS token keeps one BOS.
  EXPECT_EQ(set.examples[1].tokens, (std::vector<int64_t>{2, 'Q', '\n', 'A', 2}));
  EXPECT_EQ(set.examples[1].learned, (std::vector<uint8_t>{0, 0, 0, 1, 1}));
}

TEST(InstructionDataTest, ConversationsLearnEveryAssistantTurn) {
  const fs::path dir = testing::temp_dir("instructions_chat");
  const BpeTokenizer tokenizer = byte_tokenizer(dir);
  InstructionFormat format;
  format.system_prefix = "S:", format.user_prefix = "U:", format.assistant_prefix = "A:", format.turn_end = "\n";
  format.eos = 2;
  std::ofstream(dir / "c.jsonl") << R"({"messages": [{"role": "system", "content": "be"}, {"role": "user", "content": "x"},)"
                                 << R"( {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"},)"
                                 << R"( {"role": "assistant", "content": "w"}]})" << "\n";
  const InstructionSet set = read_instructions((dir / "c.jsonl").string(), tokenizer, format);
  ASSERT_EQ(set.examples.size(), 1u);
  // "S:be\n" "U:x\n" "A:" y EOS "U:z\n" "A:" w EOS; no BOS in this format.
  std::vector<int64_t> expected = bytes_of("S:be\nU:x\nA:y");
  expected.push_back(2);
  for (int64_t id : bytes_of("U:z\nA:w")) expected.push_back(id);
  expected.push_back(2);
  EXPECT_EQ(set.examples[0].tokens, expected);
  std::vector<uint8_t> learned(expected.size(), 0);
  learned[11] = learned[12] = 1;  // y and its EOS
  learned[19] = learned[20] = 1;  // w and its EOS
  EXPECT_EQ(set.examples[0].learned, learned);
}

TEST(InstructionDataTest, LongExamplesAreSkippedAndBadLinesNamed) {
  const fs::path dir = testing::temp_dir("instructions_bad");
  const BpeTokenizer tokenizer = byte_tokenizer(dir);
  InstructionFormat format;
  format.eos = 2;
  format.max_tokens = 8;
  std::ofstream(dir / "long.jsonl") << R"({"prompt": "short", "response": "ok"})" << "\n"
                                    << R"({"prompt": "a much longer prompt", "response": "ok"})" << "\n";
  const InstructionSet set = read_instructions((dir / "long.jsonl").string(), tokenizer, format);
  EXPECT_EQ(set.examples.size(), 0u);  // "short\nok" + EOS is 9 tokens: over 8 too
  EXPECT_EQ(set.skipped_too_long, 2);
  format.max_tokens = 9;
  EXPECT_EQ(read_instructions((dir / "long.jsonl").string(), tokenizer, format).examples.size(), 1u);

  auto error_for = [&](const std::string& line) {
    std::ofstream(dir / "bad.jsonl") << R"({"prompt": "p", "response": "r"})" << "\n" << line << "\n";
    return testing::error_message([&] { read_instructions((dir / "bad.jsonl").string(), tokenizer, format); });
  };
  EXPECT_TRUE(testing::Contains(error_for("{\"prompt\": "), "bad.jsonl:2: not valid JSON"));
  EXPECT_TRUE(testing::Contains(error_for(R"({"prompt": "p"})"), "bad.jsonl:2: expected a non-empty string \"response\""));
  EXPECT_TRUE(testing::Contains(error_for(R"({"messages": [{"role": "bot", "content": "x"}]})"), "unknown role \"bot\""));
  EXPECT_TRUE(testing::Contains(error_for(R"({"messages": [{"role": "user", "content": "x"}]})"), "no assistant turn"));
}

}  // namespace
}  // namespace kuafu::io

// Llama 2's tokenizer.model (a SentencePiece model file, no tokenizer.json beside it), read as transformers'
// LlamaTokenizer reads it. Reference: tests/python/bpe_reference.py spm trains a 1,800-piece SentencePiece
// BPE with the `sentencepiece` library on 95% of the King James Bible (Llama 2's trainer settings), and
// transformers' AutoTokenizer and sentencepiece itself encode the other 5% and texts with accents, CJK,
// Devanagari, emoji (byte fallback), runs of spaces, tabs, newlines and special pieces written out. The
// wire format, the merges' order and bad files are checked on models written byte by byte here.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/io/bpe_tokenizer.h"
#include "core/io/sentencepiece_model.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/text.h"
#include "tests/core/io/bible_reference.h"
#include "tests/support/python_reference.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {
namespace fs = std::filesystem;

// Exactly, on every text: from_folder's ids are AutoTokenizer(text, add_special_tokens=False)'s (encode adds
// nothing; added_before and added_after hold what transformers adds) and its decode is AutoTokenizer's; every piece
// has its id. With legacy false (Llama 2's setting) the ids are also sentencepiece's own wherever the two
// libraries agree: texts that neither begin with a space (tokenizers' Metaspace puts no second "▁" before
// one, sentencepiece does) or a user-defined piece (sentencepiece puts its "▁" before the piece, tokenizers
// before the text after it) nor write out a control or unknown piece (transformers matches them whole,
// sentencepiece reads them as text). The folders' add_bos_token puts <s> before a text, as transformers does.
// The folder reads the same as the tokenizer.json transformers saves from it.
TEST(SentencePieceModelTest, LlamaFoldersGiveTransformersAndSentencePieceIds) {
  const fs::path dir = testing::temp_dir("sentencepiece_model");
  ASSERT_NO_FATAL_FAILURE(bpe_reference_on_bible(dir, "spm"));
  const auto pieces = nlohmann::json::parse(read_file((dir / "spm_pieces.json").string())).get<std::vector<std::string>>();
  ASSERT_EQ(pieces.size(), 1800u);
  for (const std::string variant : {"spm_first", "spm_legacy", "spm_never"}) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_folder((dir / variant).string());
    ASSERT_EQ(tokenizer.vocab_size(), 1800);
    for (size_t id = 0; id < pieces.size(); ++id) ASSERT_EQ(tokenizer.token_id(pieces[id]), static_cast<int64_t>(id)) << pieces[id];
    const nlohmann::json cases = nlohmann::json::parse(read_file((dir / ("expected_" + variant + ".json")).string()));
    ASSERT_EQ(cases.size(), 23u);
    ASSERT_GT(cases.back()["text"].get<std::string>().size(), 100000u) << "the held-out part of the Bible";
    int compared_with_sentencepiece = 0;
    for (const auto& item : cases) {
      const std::string sample = item["text"];
      SCOPED_TRACE(variant + ": " + text::abbreviate(sample, 60));
      const std::vector<int64_t> ids = tokenizer.encode(sample);
      EXPECT_EQ(ids, item["ids"].get<std::vector<int64_t>>());
      EXPECT_EQ(tokenizer.decode(ids), item["decoded"].get<std::string>());
      std::vector<int64_t> with_special = tokenizer.added_before();  // add_bos_token true: <s> first
      with_special.insert(with_special.end(), ids.begin(), ids.end());
      with_special.insert(with_special.end(), tokenizer.added_after().begin(), tokenizer.added_after().end());
      EXPECT_EQ(with_special, item["with_special"].get<std::vector<int64_t>>());
      bool agree = variant == "spm_first" && !text::starts_with(sample, " ") && !text::starts_with(sample, "<sep>");
      for (const char* written : {"<s>", "</s>", "<ctl>", "<unk>"}) agree &= sample.find(written) == std::string::npos;
      if (agree) {
        EXPECT_EQ(ids, item["sp_ids"].get<std::vector<int64_t>>());
        ++compared_with_sentencepiece;
      }
    }
    if (variant == "spm_first") {
      EXPECT_EQ(compared_with_sentencepiece, 16);
    }
  }
  const BpeTokenizer first = BpeTokenizer::from_folder((dir / "spm_first").string());
  EXPECT_TRUE(first.same_as(BpeTokenizer::from_folder((dir / "spm_saved").string())));
  EXPECT_FALSE(first.same_as(BpeTokenizer::from_folder((dir / "spm_legacy").string())));
}

// Protocol buffers' wire format, written by hand.
std::string wire_varint(uint64_t value) {
  std::string out;
  do {
    out += static_cast<char>((value & 0x7F) | (value > 0x7F ? 0x80 : 0));
    value >>= 7;
  } while (value);
  return out;
}
std::string wire_length_field(int field, const std::string& payload) {
  return wire_varint(static_cast<uint64_t>(field) << 3 | 2) + wire_varint(payload.size()) + payload;
}
std::string wire_number_field(int field, uint64_t value) { return wire_varint(static_cast<uint64_t>(field) << 3) + wire_varint(value); }
// ModelProto.pieces: text, a score of -1.5 (fixed32, little-endian), type.
std::string model_piece(const std::string& text, int type) {
  return wire_length_field(1, wire_length_field(1, text) + std::string("\x15\x00\x00\xC0\xBF", 5) + wire_number_field(3, type));
}

// A BPE model: <unk>, <s>, </s>, the 256 byte pieces (ids 3 .. 258), "▁", a, b, c, then `merged` pieces in
// order, a user-defined <sep>; trainer_spec (model_type `type`) and a normalizer_spec Kuafu skips.
std::string tiny_spm_model(const std::vector<std::string>& merged, int type = 2) {
  std::string model = model_piece("<unk>", 2) + model_piece("<s>", 3) + model_piece("</s>", 3);
  const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) model += model_piece(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 6);
  for (const char* text : {"\u2581", "a", "b", "c"}) model += model_piece(text, 1);
  for (const std::string& text : merged) model += model_piece(text, 1);
  model += model_piece("<sep>", 4);
  return model + wire_length_field(2, wire_length_field(2, "prefix") + wire_number_field(3, type)) + wire_length_field(3, wire_length_field(1, "identity"));
}

fs::path write_spm_folder(const fs::path& dir, const std::string& model, const std::string& config = R"({"tokenizer_class": "LlamaTokenizer"})") {
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.model", std::ios::binary) << model;
  std::ofstream(dir / "tokenizer_config.json") << config;
  return dir;
}

TEST(SentencePieceModelTest, PiecesAndMergesAsWorkedByHand) {
  const fs::path dir = testing::temp_dir("sentencepiece_by_hand");
  const SentencePieceModel model = parse_sentencepiece_model(tiny_spm_model({"bc", "ab", "\u2581ab"}), "tiny");
  ASSERT_EQ(model.pieces.size(), 267u);
  EXPECT_EQ(model.model_type, SentencePieceModel::ModelType::Bpe);
  EXPECT_EQ(model.pieces[0].type, SentencePieceModel::PieceType::Unknown);
  EXPECT_EQ(model.pieces[3].text, "<0x00>");
  EXPECT_EQ(model.pieces[3].type, SentencePieceModel::PieceType::Byte);
  EXPECT_EQ(model.pieces[265].text, "\u2581ab");
  EXPECT_EQ(model.pieces[265].score, -1.5f);
  EXPECT_EQ(model.pieces[266].type, SentencePieceModel::PieceType::UserDefined);

  // Ids: ▁ 259, a 260, b 261, c 262, then the merged pieces from 263. Merges rank by the whole piece's id:
  // "bc" (263) before "ab" (264), so "abc" is a + bc; listed the other way round it is ab + c.
  const BpeTokenizer bc_first = BpeTokenizer::from_folder(write_spm_folder(dir / "bc_first", tiny_spm_model({"bc", "ab"})).string());
  EXPECT_EQ(bc_first.encode("abc"), (std::vector<int64_t>{259, 260, 263}));
  const BpeTokenizer ab_first = BpeTokenizer::from_folder(write_spm_folder(dir / "ab_first", tiny_spm_model({"ab", "bc"})).string());
  EXPECT_EQ(ab_first.encode("abc"), (std::vector<int64_t>{259, 263, 262}));
  // "▁ab" cuts into ▁ + ab (both pieces) and ▁a + b (▁a is none): "ab ab" is ▁ab twice. The user-defined
  // <sep> and the control <s> are matched whole; after them no "▁" (legacy false: before the text's start
  // only); "é" (C3 A9) is spelt by its bytes' pieces.
  const BpeTokenizer marks = BpeTokenizer::from_folder(write_spm_folder(dir / "marks", tiny_spm_model({"ab", "\u2581ab"})).string());
  EXPECT_EQ(marks.encode("ab ab"), (std::vector<int64_t>{264, 264}));
  EXPECT_EQ(marks.encode("ab<sep>ab<s>\u00e9"), (std::vector<int64_t>{264, 265, 263, 1, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(marks.decode({264, 265, 263, 1, 3 + 0xC3, 3 + 0xA9}), "ab<sep>ab<s>\u00e9");
  // Without a tokenizer_config.json the folder reads as LlamaTokenizer's defaults.
  fs::remove(dir / "marks" / "tokenizer_config.json");
  EXPECT_TRUE(BpeTokenizer::from_folder((dir / "marks").string()).same_as(marks));
}

TEST(SentencePieceModelTest, BadModelsAndFoldersAreNamed) {
  const fs::path dir = testing::temp_dir("sentencepiece_bad");
  const std::string good = tiny_spm_model({"ab"});
  auto error_of = [&](const std::string& name, const std::string& model, const std::string& config = R"({"tokenizer_class": "LlamaTokenizer"})") {
    return testing::error_message([&] { BpeTokenizer::from_folder(write_spm_folder(dir / name, model, config).string()); });
  };
  EXPECT_TRUE(testing::Contains(error_of("truncated", good.substr(0, good.size() - 3)), "truncated/tokenizer.model: byte "));
  EXPECT_TRUE(testing::Contains(error_of("truncated", good.substr(0, good.size() - 3)), "the file is truncated or not a SentencePiece model"));
  EXPECT_TRUE(testing::Contains(error_of("text", "{\"model\": \"BPE\"}\n"), "text/tokenizer.model: byte 0: field 15 of wire type 3"));
  EXPECT_TRUE(testing::Contains(error_of("empty", ""), "empty/tokenizer.model: no pieces (0 bytes)"));
  EXPECT_TRUE(testing::Contains(error_of("unigram", tiny_spm_model({"ab"}, 1)),
                                "unigram/tokenizer.model: a SentencePiece unigram model; Kuafu reads BPE models"));
  EXPECT_TRUE(testing::Contains(error_of("not_utf8", good + model_piece("a\xFF", 1)), "not_utf8/tokenizer.model: piece 265 (byte "));
  EXPECT_TRUE(testing::Contains(error_of("not_utf8", good + model_piece("a\xFF", 1)), ") is not UTF-8 at its byte 1"));
  EXPECT_TRUE(testing::Contains(error_of("odd_type", good + model_piece("z", 9)), "odd_type/tokenizer.model: piece 265 has type 9"));
  EXPECT_TRUE(testing::Contains(error_of("twice", good + model_piece("ab", 1)), "token 'ab' has two ids, 263 and 265"));
  EXPECT_TRUE(testing::Contains(error_of("t5", good, R"({"tokenizer_class": "T5Tokenizer"})"),
                                "t5/tokenizer_config.json: tokenizer_class T5Tokenizer with a tokenizer.model and no tokenizer.json is not supported"));
  EXPECT_TRUE(testing::Contains(error_of("pad", good, R"({"tokenizer_class": "LlamaTokenizer", "pad_token": "<pad>"})"),
                                "pad/tokenizer_config.json: special token '<pad>' is not a piece of "));
  EXPECT_TRUE(testing::Contains(
      error_of("decoder", good, R"({"tokenizer_class": "LlamaTokenizer", "added_tokens_decoder": {"5": {"content": "</s>"}}})"),
      "decoder/tokenizer_config.json: added_tokens_decoder gives '</s>' id 5, but it is piece 2 of "));
  // Byte fallback needs the 256 byte pieces.
  EXPECT_TRUE(testing::Contains(error_of("no_bytes", model_piece("<unk>", 2) + model_piece("<s>", 3) + model_piece("</s>", 3) + model_piece("a", 1) + wire_length_field(2, wire_number_field(3, 2))),
                                "lacks <0x00>"));
}

}  // namespace
}  // namespace kuafu::io

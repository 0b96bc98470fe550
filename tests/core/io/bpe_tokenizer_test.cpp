// Byte-level BPE: ids equal Hugging Face `tokenizers`' on held-out text (tests/python/bpe_reference.py
// trains a 2,000-token byte-level BPE on 95% of the King James Bible, exported by data/kjv/export.sh;
// the rest and strings with non-ASCII, runs of spaces and newlines, digits and special tokens are
// encoded by both) and tiktoken's with GPT-2's real vocabulary; decode(encode(x)) == x; merges worked
// by hand; bad input named. SentencePiece's BPE as Llama 2's, Mistral's and TinyLlama's tokenizer.json
// hold it (characters, "▁" for spaces, <0xNN> byte fallback): transformers' ids and decoded text on the
// same held-out text; byte fallback and fused unknowns worked by hand; options Kuafu does not apply refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/io/bpe_tokenizer.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/text.h"
#include "tests/core/io/bible_reference.h"
#include "tests/support/python_reference.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {
namespace fs = std::filesystem;

TEST(BpeTokenizerTest, IdsEqualHuggingFaceTokenizersOnHeldOutText) {
  const fs::path dir = testing::temp_dir("bpe_reference");
  ASSERT_NO_FATAL_FAILURE(bpe_reference_on_bible(dir, "build"));
  const nlohmann::json expected = nlohmann::json::parse(read_file((dir / "expected.json").string()));
  ASSERT_EQ(expected.size(), 9u);
  ASSERT_GT(expected[0]["text"].get<std::string>().size(), 100000u) << "the held-out part of the Bible";

  const BpeTokenizer from_json = BpeTokenizer::from_tokenizer_json((dir / "tokenizer.json").string());
  const BpeTokenizer from_files = BpeTokenizer::from_files((dir / "vocab.json").string(), (dir / "merges.txt").string(),
                                                           {"<|endoftext|>", "<pad>"});
  for (const BpeTokenizer* tokenizer : {&from_json, &from_files}) {
    EXPECT_EQ(tokenizer->vocab_size(), 2000);
    for (const auto& item : expected) {
      const std::string sample = item["text"];
      SCOPED_TRACE(text::abbreviate(sample, 60));
      const std::vector<int64_t> ids = tokenizer->encode(sample);
      EXPECT_EQ(ids, item["ids"].get<std::vector<int64_t>>());
      EXPECT_EQ(tokenizer->decode(ids), sample);
    }
  }
  // A folder's add_prefix_space (tokenizer_config.json) and a tokenizer.json normalizer give
  // transformers' AutoTokenizer ids; a normalizer Kuafu does not apply is refused by name.
  for (const std::string variant : {"prefix", "lower"}) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_folder((dir / variant).string());
    const nlohmann::json cases = nlohmann::json::parse(read_file((dir / ("expected_" + variant + ".json")).string()));
    ASSERT_GE(cases.size(), 8u);
    for (const auto& item : cases) {
      const std::string sample = item["text"];
      SCOPED_TRACE(variant + ": " + text::abbreviate(sample, 60));
      EXPECT_EQ(tokenizer.encode(sample), item["ids"].get<std::vector<int64_t>>());
    }
  }
  // Llama 3's and Qwen2's layout: a Split by the family's pattern keeping the text between matches
  // (behavior Isolated), ByteLevel without GPT-2's pattern, Llama 3's ignore_merges, Qwen's NFC: the ids and
  // decoded text of transformers' AutoTokenizer on multilingual, emoji (a ZWJ family), whitespace-heavy,
  // digit-run and special-token text, and 20,000 characters of the training lines.
  for (const std::string variant : {"llama3", "qwen2"}) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_folder((dir / variant).string());
    const nlohmann::json cases = nlohmann::json::parse(read_file((dir / ("expected_" + variant + ".json")).string()));
    ASSERT_EQ(cases.size(), 12u);
    for (const auto& item : cases) {
      const std::string sample = item["text"];
      SCOPED_TRACE(variant + ": " + text::abbreviate(sample, 60));
      const std::vector<int64_t> ids = tokenizer.encode(sample);
      EXPECT_EQ(ids, item["ids"].get<std::vector<int64_t>>());
      EXPECT_EQ(tokenizer.decode(ids), item["decoded"].get<std::string>());
    }
  }
  EXPECT_FALSE(BpeTokenizer::from_folder((dir / "llama3").string()).same_as(BpeTokenizer::from_folder((dir / "qwen2").string())));
  try {
    BpeTokenizer::from_folder((dir / "replace").string());
    ADD_FAILURE() << "a Replace normalizer must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("normalizer \"Replace\" is not supported"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("replace/tokenizer.json"), std::string::npos) << e.what();
  }
}

// SentencePiece's BPE in Llama 2's layouts (tests/python/bpe_reference.py sentencepiece: trained by
// `tokenizers` on the same 95% of the Bible, with <unk> <s> </s> and the 256 byte tokens <0x00> .. <0xFF>):
//   sp_legacy    the older file (normalizer Prepend "▁" + Replace " " -> "▁", no pre-tokenizer), read by
//                transformers as LlamaTokenizerFast with legacy true;
//   sp_metaspace the newer file (Metaspace prepend_scheme first, split false), legacy false;
//   sp_never     the same file, add_prefix_space false;
//   sp_split     NFKC, Metaspace always with split, Metaspace decoder, read as PreTrainedTokenizerFast.
// On the held-out 5% (196 kB, one piece for the files without split) and texts with accents, CJK,
// Devanagari, emoji (byte fallback, a ZWJ family), leading, repeated and trailing spaces, tabs, newlines,
// CRLF, "▁" and "<0x41>" written out, and <s> / </s> inside the text, exactly:
//   - from_folder: BOS + encode(text) == AutoTokenizer(text)["input_ids"] (Kuafu's encode adds no BOS; the
//     callers add the folder's), decode of those ids and of encode(text) == AutoTokenizer's decode
//     (special tokens kept);
//   - from_tokenizer_json: the file alone as `tokenizers` reads it (Tokenizer.from_file, no special tokens
//     added): its ids and decoded text. For sp_legacy these differ from the folder's, as transformers 5's
//     LlamaTokenizer replaces the file's normalizer by a Metaspace.
TEST(BpeTokenizerTest, SentencePieceLayoutsGiveTransformersIdsOnHeldOutText) {
  const fs::path dir = testing::temp_dir("bpe_sentencepiece");
  ASSERT_NO_FATAL_FAILURE(bpe_reference_on_bible(dir, "sentencepiece"));
  for (const std::string variant : {"sp_legacy", "sp_metaspace", "sp_never", "sp_split"}) {
    const BpeTokenizer folder = BpeTokenizer::from_folder((dir / variant).string());
    const BpeTokenizer file = BpeTokenizer::from_tokenizer_json((dir / variant / "tokenizer.json").string());
    EXPECT_EQ(folder.vocab_size(), 1800);
    ASSERT_EQ(folder.token_id("<s>"), 1);
    EXPECT_EQ(folder.token_id("<0x00>"), 3);
    EXPECT_EQ(folder.same_as(file), variant == "sp_metaspace" || variant == "sp_split") << variant;
    const nlohmann::json cases = nlohmann::json::parse(read_file((dir / ("expected_" + variant + ".json")).string()));
    ASSERT_EQ(cases.size(), 21u);
    ASSERT_GT(cases.back()["text"].get<std::string>().size(), 100000u) << "the held-out part of the Bible";
    for (const auto& item : cases) {
      const std::string sample = item["text"];
      SCOPED_TRACE(variant + ": " + text::abbreviate(sample, 60));
      const std::vector<int64_t> ids = folder.encode(sample);
      std::vector<int64_t> with_bos = {1};
      with_bos.insert(with_bos.end(), ids.begin(), ids.end());
      EXPECT_EQ(with_bos, item["ids"].get<std::vector<int64_t>>());
      EXPECT_EQ(folder.decode(with_bos), item["decoded"].get<std::string>());
      EXPECT_EQ(folder.decode(ids), item["decoded_without_bos"].get<std::string>());
      const std::vector<int64_t> file_ids = file.encode(sample);
      EXPECT_EQ(file_ids, item["file_ids"].get<std::vector<int64_t>>());
      EXPECT_EQ(file.decode(file_ids), item["file_decoded"].get<std::string>());
    }
  }
}

// A SentencePiece tokenizer.json small enough to work by hand: "▁" (U+2581) stands for a space.
nlohmann::json sentencepiece_json(bool byte_fallback) {
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"\u2581", 2}, {"a", 3}, {"b", 4}, {"ab", 5}, {"\u2581ab", 6}};
  if (byte_fallback) {
    const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) vocab[std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">"] = 7 + b;
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "\u2581 ab"}}, {"unk_token", "<unk>"},
                     {"fuse_unk", true}, {"byte_fallback", byte_fallback}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}}},
          {"decoder", {{"type", "Sequence"},
                       {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                     {{"type", "ByteFallback"}},
                                     {{"type", "Fuse"}},
                                     {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"added_tokens", {{{"id", 1}, {"content", "<s>"}, {"special", true}}}}};
}

TEST(BpeTokenizerTest, SentencePieceBytesAndUnknownsAsWorkedByHand) {
  const fs::path dir = testing::temp_dir("bpe_sentencepiece_tiny");
  nlohmann::json file = sentencepiece_json(false);
  std::ofstream(dir / "tokenizer.json") << file.dump();
  const BpeTokenizer unknowns = BpeTokenizer::from_tokenizer_json((dir / "tokenizer.json").string());
  // "ab xyz ab" -> "▁ab▁xyz▁ab" (a mark first, one per space); x, y and z are unknown, fused into one
  // <unk>; "a b" merges first (rank 0), then "▁ ab" (rank 1), twice.
  EXPECT_EQ(unknowns.encode("ab xyz ab"), (std::vector<int64_t>{6, 2, 0, 6}));
  // After <s> the text gets no mark (prepend_scheme "first": only at the text's start).
  EXPECT_EQ(unknowns.encode("<s>ab"), (std::vector<int64_t>{1, 5}));
  // Marks back to spaces, the leading one stripped; special tokens kept.
  EXPECT_EQ(unknowns.decode({6, 2, 0, 6}), "ab <unk> ab");
  EXPECT_EQ(unknowns.decode({1, 6}), "<s> ab");
  file["model"]["fuse_unk"] = false;
  std::ofstream(dir / "tokenizer.json") << file.dump();
  EXPECT_EQ(BpeTokenizer::from_tokenizer_json((dir / "tokenizer.json").string()).encode("ab xyz ab"),
            (std::vector<int64_t>{6, 2, 0, 0, 0, 6}));

  std::ofstream(dir / "tokenizer.json") << sentencepiece_json(true).dump();
  const BpeTokenizer bytes = BpeTokenizer::from_tokenizer_json((dir / "tokenizer.json").string());
  // "é" (C3 A9) is spelt by its bytes' tokens <0xC3> = 7 + 0xC3 and <0xA9> = 7 + 0xA9, and decodes back.
  const std::vector<int64_t> ids = bytes.encode("ab \u00e9");
  EXPECT_EQ(ids, (std::vector<int64_t>{6, 2, 7 + 0xC3, 7 + 0xA9}));
  EXPECT_EQ(bytes.decode(ids), "ab \u00e9");
  // A byte token alone is no UTF-8: U+FFFD, as tokenizers' ByteFallback decoder gives.
  EXPECT_EQ(bytes.decode({6, 7 + 0xC3}), "ab\uFFFD");
}

// Options of a SentencePiece tokenizer.json Kuafu does not apply are refused, naming the file and field.
TEST(BpeTokenizerTest, SentencePieceOptionsKuafuDoesNotApplyAreRefused) {
  const fs::path dir = testing::temp_dir("bpe_sentencepiece_refused");
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& f) { f["pre_tokenizer"]["prepend_scheme"] = "sometimes"; },
       "tokenizer.json: pre_tokenizer.prepend_scheme \"sometimes\" is not supported (first, always or never)"},
      {[](nlohmann::json& f) { f["model"]["byte_fallback"] = true; },
       "tokenizer.json: model.byte_fallback needs the 256 byte tokens <0x00> .. <0xFF> in the vocabulary, and it lacks <0x00>"},
      {[](nlohmann::json& f) { f["pre_tokenizer"]["replacement"] = "__"; },
       "tokenizer.json: pre_tokenizer.replacement must be one character, found \"__\""},
      {[](nlohmann::json& f) { f["pre_tokenizer"]["split"] = "no"; },
       "tokenizer.json: pre_tokenizer.split must be true or false"},
      {[](nlohmann::json& f) { f["decoder"] = nullptr; }, "tokenizer.json: decoder: SentencePiece's layout needs one"},
      {[](nlohmann::json& f) { f["decoder"]["decoders"][0]["pattern"] = {{"Regex", "\u2581+"}}; },
       "tokenizer.json: decoder.decoders[0] \"Replace\" is not supported"},
      {[](nlohmann::json& f) { f["decoder"]["decoders"][3]["start"] = -1; },
       "tokenizer.json: decoder.decoders[3].start must be a whole number from 0, found -1"},
      {[](nlohmann::json& f) { f["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "twice"}}; },
       "tokenizer.json: decoder.prepend_scheme \"twice\" is not supported"},
      {[](nlohmann::json& f) { f["decoder"] = {{"type", "WordPiece"}}; },
       "tokenizer.json: decoder \"WordPiece\" is not supported"},
      {[](nlohmann::json& f) { f["model"]["dropout"] = 0.1; }, "tokenizer.json: model.dropout 0.1 is not supported"},
      {[](nlohmann::json& f) { f["model"]["end_of_word_suffix"] = "</w>"; },
       "tokenizer.json: model.end_of_word_suffix is not supported with SentencePiece's layout"},
      {[](nlohmann::json& f) { f["normalizer"] = {{"type", "Prepend"}, {"prepend", 1}}; },
       "tokenizer.json: normalizer \"Prepend\" is not supported"},
  };
  for (const auto& [change, expected] : cases) {
    nlohmann::json file = sentencepiece_json(false);
    change(file);
    std::ofstream(dir / "tokenizer.json") << file.dump();
    EXPECT_TRUE(testing::Contains(
        testing::expected_error([&] { BpeTokenizer::from_tokenizer_json((dir / "tokenizer.json").string()); }), expected))
        << file.dump();
  }
  // A folder naming transformers' LlamaTokenizer is read with byte fallback, as that class builds it: the
  // byte tokens must be there.
  std::ofstream(dir / "tokenizer.json") << sentencepiece_json(false).dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"tokenizer_class": "LlamaTokenizerFast"})";
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { BpeTokenizer::from_folder(dir.string()); }),
                                "tokenizer_config.json: tokenizer_class LlamaTokenizerFast (byte fallback) needs the 256 byte "
                                "tokens <0x00> .. <0xFF> in the vocabulary, and it lacks <0x00>"));
}

// GPT-2's own 50,257-token vocabulary (from openai-whisper's gpt2.tiktoken, converted to vocab.json +
// merges.txt by the script) on 1 MB of the Bible and 1 MB of GCIDE (dict-gcide): tiktoken's ids.
TEST(BpeTokenizerTest, GPT2sVocabularyGivesTiktokensIds) {
  const fs::path dir = testing::temp_dir("bpe_gpt2");
  ASSERT_NO_FATAL_FAILURE(export_bible(dir));
  const std::string gcide = "/usr/share/dictd/gcide.dict.dz";
  ASSERT_TRUE(fs::exists(gcide)) << gcide << " comes with Debian's dict-gcide (scripts/setup)";
  const testing::PythonRun run = testing::run_python_reference(
      "gpt2_bpe_reference.py", "build " + (dir / "kjv/kjv.txt").string() + " " + gcide + " " + dir.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json expected = nlohmann::json::parse(read_file((dir / "expected.json").string()));
  ASSERT_EQ(expected.size(), 5u);
  const BpeTokenizer gpt2 =
      BpeTokenizer::from_files((dir / "vocab.json").string(), (dir / "merges.txt").string(), {"<|endoftext|>"});
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  EXPECT_EQ(gpt2.token_id("<|endoftext|>"), 50256);
  size_t bytes = 0;
  for (const auto& item : expected) {
    const std::string sample = item["text"];
    SCOPED_TRACE(text::abbreviate(sample, 60));
    bytes += sample.size();
    const std::vector<int64_t> ids = gpt2.encode(sample);
    EXPECT_EQ(ids, item["ids"].get<std::vector<int64_t>>());
    EXPECT_EQ(gpt2.decode(ids), sample);
  }
  EXPECT_GE(bytes, 2000000u);
}

// A vocabulary and merges small enough to work by hand. "Ġ" is the space byte's character.
BpeTokenizer tiny_tokenizer(const fs::path& dir) {
  nlohmann::json vocab = nlohmann::json::object();
  int64_t id = 0;
  for (int b = 0; b < 256; ++b) {
    // Every byte's character, as bytes_to_unicode gives it: printable ASCII as itself.
    if (b >= 33 && b <= 126) vocab[std::string(1, static_cast<char>(b))] = id++;
  }
  vocab["\xC4\xA0"] = id++;  // Ġ (space)
  for (const char* merged : {"ab", "abc", "\xC4\xA0" "ab", "cc", "<eos>"}) vocab[merged] = id++;
  std::ofstream(dir / "vocab.json") << vocab.dump();
  std::ofstream(dir / "merges.txt") << "#version: 0.2\na b\nab c\n\xC4\xA0 ab\nc c\n";
  return BpeTokenizer::from_files((dir / "vocab.json").string(), (dir / "merges.txt").string(), {"<eos>"});
}

TEST(BpeTokenizerTest, MergesApplyByRankAsWorkedByHand) {
  const fs::path dir = testing::temp_dir("bpe_tiny");
  const BpeTokenizer t = tiny_tokenizer(dir);
  auto id = [&](const std::string& token) { return *t.token_id(token); };
  // "abc": a b -> ab (rank 0), ab c -> abc (rank 1).
  EXPECT_EQ(t.encode("abc"), std::vector<int64_t>{id("abc")});
  // " abcc": Ġ a b c c -> Ġ ab c c (rank 0) -> Ġ abc c (rank 1; "Ġ ab" is rank 2 and comes later)
  // -> no more ranked pairs ("abc c" has none).
  EXPECT_EQ(t.encode(" abcc"), (std::vector<int64_t>{id("\xC4\xA0"), id("abc"), id("c")}));
  // "ccc": c c -> cc once, left to right, leaving the last c.
  EXPECT_EQ(t.encode("ccc"), (std::vector<int64_t>{id("cc"), id("c")}));
  // The special token is matched whole, never merged into its neighbours.
  EXPECT_EQ(t.encode("ab<eos>ab"), (std::vector<int64_t>{id("ab"), id("<eos>"), id("ab")}));
  EXPECT_EQ(t.decode(t.encode("ab<eos>ab")), "ab<eos>ab");
}

// A model folder: tokenizer.json when there is one; else vocab.json + merges.txt with the special
// tokens special_tokens_map.json names (as strings or {"content": ...}).
TEST(BpeTokenizerTest, AFolderNamesItsSpecialTokens) {
  const fs::path dir = testing::temp_dir("bpe_folder");
  tiny_tokenizer(dir);  // writes vocab.json (with "<eos>") and merges.txt
  std::ofstream(dir / "special_tokens_map.json") << R"({"eos_token": {"content": "<eos>"}, "pad_token": "<eos>"})";
  const BpeTokenizer from_folder = BpeTokenizer::from_folder(dir.string());
  const int64_t eos = *from_folder.token_id("<eos>");
  EXPECT_EQ(from_folder.encode("ab<eos>"), (std::vector<int64_t>{*from_folder.token_id("ab"), eos}));
  // Without the map "<eos>" is ordinary text: its characters.
  fs::remove(dir / "special_tokens_map.json");
  const BpeTokenizer plain = BpeTokenizer::from_folder(dir.string());
  EXPECT_EQ(plain.encode("<eos>").size(), 5u);
  // A tokenizer.json beside them wins.
  nlohmann::json vocab = nlohmann::json::parse(read_file((dir / "vocab.json").string()));
  nlohmann::json file = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array({"a b"})}}},
                         {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                         {"added_tokens", nlohmann::json::array({{{"id", eos}, {"content", "<eos>"}, {"special", true}}})}};
  std::ofstream(dir / "tokenizer.json") << file.dump();
  const BpeTokenizer from_json = BpeTokenizer::from_folder(dir.string());
  // Only "a b" is a merge here: "abc" stays "ab" + "c", and "<eos>" is special again.
  EXPECT_EQ(from_json.encode("abc<eos>"),
            (std::vector<int64_t>{*from_json.token_id("ab"), *from_json.token_id("c"), eos}));
  const fs::path empty = testing::temp_dir("bpe_no_folder");
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { BpeTokenizer::from_folder(empty.string()); }),
                                "no tokenizer.json, no tokenizer.model (SentencePiece) and no vocab.json + merges.txt"));
}

TEST(BpeTokenizerTest, BadInputIsNamed) {
  const fs::path dir = testing::temp_dir("bpe_bad");
  const BpeTokenizer t = tiny_tokenizer(dir);
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { t.encode("ab\xFF" "c"); }), "not valid UTF-8 at byte 2"));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { t.decode({99999}); }), "id 99999 is not in the vocabulary"));
  std::ofstream(dir / "bad_merges.txt") << "a b\nabc\n";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] {
    BpeTokenizer::from_files((dir / "vocab.json").string(), (dir / "bad_merges.txt").string());
  }), "bad_merges.txt:2: expected \"left right\""));
  std::ofstream(dir / "unknown_merge.txt") << "x y\n";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] {
    BpeTokenizer::from_files((dir / "vocab.json").string(), (dir / "unknown_merge.txt").string());
  }), "makes a token the vocabulary lacks"));
  EXPECT_TRUE(testing::Contains(testing::error_message([&] {
    BpeTokenizer::from_files((dir / "vocab.json").string(), (dir / "merges.txt").string(), {"<bos>"});
  }), "special token '<bos>' is not in the vocabulary"));
  std::ofstream(dir / "broken.json") << "{\"model\": ";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { BpeTokenizer::from_tokenizer_json((dir / "broken.json").string()); }),
                                "broken.json: not valid JSON"));
}

// Found by fuzz_tokenizer_json (fuzz/corpus/tokenizer_json/crash-sequence-without-pretokenizers): a
// Sequence pre_tokenizer without "pretokenizers" read freed memory (operator[] of a const object), and
// fields of another type escaped as nlohmann::json's type_error, naming no file.
TEST(BpeTokenizerTest, TokenizerJsonOfAnotherShapeIsNamed) {
  const fs::path dir = testing::temp_dir("bpe_tokenizer_json_shapes");
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "<s>": 1}, "merges": []})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"pre_tokenizer": {"type": "Sequence", "pretokinezers": []}, )" + model + "}",
       "a Sequence pre_tokenizer is read only as a Split by a Regex pattern"},
      {R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [1, 2]}, )" + model + "}",
       "a Sequence pre_tokenizer is read only as a Split by a Regex pattern"},
      {R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "a"},
         "behavior": "MergedWithPrevious"}, {"type": "ByteLevel"}]}, )" + model + "}",
       "as CLIP (behavior Removed, inverted) and Llama 3 and Qwen (behavior Isolated, not inverted) write it"},
      {R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "a"},
         "behavior": "Removed", "invert": false}, {"type": "ByteLevel"}]}, )" + model + "}",
       "as CLIP (behavior Removed, inverted)"},
      {R"({"pre_tokenizer": {"type": "ByteLevel", "use_regex": 1}, )" + model + "}",
       "pre_tokenizer.use_regex must be true or false, found 1"},
      {R"({"pre_tokenizer": {"type": 7}, )" + model + "}", "expected a ByteLevel pre_tokenizer"},
      {R"({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": "yes"}, )" + model + "}",
       "pre_tokenizer.add_prefix_space must be true or false, found \"yes\""},
      {R"({"pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": [{"content": "<s>"}], )" + model + "}",
       "added_tokens: expected {\"id\": <integer>, \"content\": <non-empty text>}, found {\"content\":\"<s>\"}"},
      {R"({"pre_tokenizer": {"type": "ByteLevel"}, "normalizer": {"type": ["NFC"]}, )" + model + "}",
       "normalizer \"\" is not supported"},
  };
  for (const auto& [json, expected] : cases) {
    std::ofstream(dir / "tokenizer.json") << json;
    EXPECT_TRUE(testing::Contains(
        testing::expected_error([&] { BpeTokenizer::from_tokenizer_json((dir / "tokenizer.json").string()); }),
        expected))
        << json;
  }
}

// Found by fuzz_bpe_files (fuzz/corpus/bpe_files/crash-two-tokens-one-id): two tokens of one id loaded,
// and decoding that id gave the other token, so decode(encode(text)) != text.
TEST(BpeTokenizerTest, TwoTokensOfOneIdAreRefused) {
  const fs::path dir = testing::temp_dir("bpe_shared_id");
  std::ofstream(dir / "vocab.json") << R"({"a": 0, "b": 0, "c": 1})";
  std::ofstream(dir / "merges.txt") << "#version: 0.2\n";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] {
    BpeTokenizer::from_files((dir / "vocab.json").string(), (dir / "merges.txt").string());
  }), "vocab.json: id 0 is given to both 'a' and 'b'"));
}

// Found by a hand-written input to fuzz_bpe_files (fuzz/corpus/bpe_files/hand-huge-id): one token of id
// 2^31 - 648 made the id table ask for 64 GiB. Holes in the numbering are still read.
TEST(BpeTokenizerTest, AnIdFarPastTheTokensListedIsRefused) {
  const fs::path dir = testing::temp_dir("bpe_huge_id");
  std::ofstream(dir / "merges.txt") << "#version: 0.2\n";
  std::ofstream(dir / "vocab.json") << R"({"a": 2147483000})";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] {
    BpeTokenizer::from_files((dir / "vocab.json").string(), (dir / "merges.txt").string());
  }), "vocab.json: token 'a' has id 2147483000, more than 65536 past the 1 tokens the file lists"));
  std::ofstream(dir / "vocab.json") << R"({"a": 0, "b": 40000})";
  EXPECT_EQ(BpeTokenizer::from_files((dir / "vocab.json").string(), (dir / "merges.txt").string()).vocab_size(), 40001);
}


// What transformers 5's tokenizer(text) adds around a text's ids (tests/python/bpe_reference.py framing):
// a tokenizer.json's post_processor (a template with a BOS, as Llama 3's; ByteLevel then that, as Llama
// 3.1's; ByteLevel alone, as Qwen2's; none; RoBERTa's and BERT's cls / sep; a template with tokens on both
// sides), tokenizer_config.json's add_bos_token / add_eos_token beside a tokenizer.json (ignored, as
// transformers 5 ignores them) and beside vocab.json + merges.txt (read): before + encode(text) + after is
// AutoTokenizer(text)["input_ids"], exactly, for a text and the empty text. Added tokens with lstrip / rstrip
// take the whitespace beside them (spaces, tabs, newlines, U+3000, U+00A0, U+2003) as tokenizers does.
TEST(BpeTokenizerTest, WhatTransformersAddsAroundATextIsTheFoldersOwn) {
  const fs::path dir = testing::temp_dir("bpe_framing");
  ASSERT_NO_FATAL_FAILURE(bpe_reference_on_bible(dir, "framing"));
  const nlohmann::json expected = nlohmann::json::parse(read_file((dir / "expected_framing.json").string()));
  ASSERT_EQ(expected.size(), 11u);
  ASSERT_EQ(expected["strip"].size(), 5u);
  int framed = 0;
  for (const auto& [name, cases] : expected.items()) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_folder((dir / ("framing_" + name)).string());
    framed += !tokenizer.added_before().empty() || !tokenizer.added_after().empty();
    for (const auto& item : cases) {
      SCOPED_TRACE(name + ": \"" + item["text"].get<std::string>() + "\"");
      const std::vector<int64_t> ids = tokenizer.encode(item["text"].get<std::string>());
      EXPECT_EQ(ids, item["without"].get<std::vector<int64_t>>());
      std::vector<int64_t> with = tokenizer.added_before();
      with.insert(with.end(), ids.begin(), ids.end());
      with.insert(with.end(), tokenizer.added_after().begin(), tokenizer.added_after().end());
      EXPECT_EQ(with, item["with"].get<std::vector<int64_t>>());
    }
  }
  EXPECT_EQ(framed, 7) << "template_bos, sequence_bos, flags_override, roberta, bert, template_both and files_bos add tokens";
}

// A post_processor Kuafu does not read, or one that names tokens it does not list, is refused by name.
TEST(BpeTokenizerTest, PostProcessorsOfAnotherShapeAreNamed) {
  const fs::path dir = testing::temp_dir("bpe_post_processor");
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"type", "Invented"}}, "tokenizer.json: post_processor \"Invented\" is not supported"},
      {{{"type", "TemplateProcessing"}, {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", nlohmann::json::object()}},
       "tokenizer.json: post_processor.special_tokens lacks the ids of '<s>'"},
      {{{"type", "TemplateProcessing"}, {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}}},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}},
       "tokenizer.json: post_processor.single has no sequence A"},
      {{{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, {{"type", "RobertaProcessing"}, {"sep", {"</s>", 99}}, {"cls", {"<s>", 1}}}}}},
       "tokenizer.json: post_processor.processors[1].sep must be [token, id] of the vocabulary"},
  };
  for (const auto& [post, message] : cases) {
    const nlohmann::json file = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"<s>", 1}}}, {"merges", nlohmann::json::array()}}},
                                 {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                                 {"post_processor", post}};
    std::ofstream(dir / "tokenizer.json") << file.dump();
    EXPECT_TRUE(testing::Contains(testing::error_message([&] { BpeTokenizer::from_tokenizer_json((dir / "tokenizer.json").string()); }),
                                  message)) << post.dump();
  }
}

}  // namespace
}  // namespace kuafu::io

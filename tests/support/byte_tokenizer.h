// A tiny byte-level BPE tokenizer folder for tests: printable ASCII, space and newline as single-byte
// tokens (id = the byte; no merges) and OPT's special tokens <s> 0, <pad> 1, </s> 2, <unk> 3, so each
// character is one id and expected ids can be worked out by hand.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/io/bpe_tokenizer.h"

namespace kuafu::testing {

inline io::BpeTokenizer write_byte_tokenizer(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 33; b <= 126; ++b) vocab[std::string(1, static_cast<char>(b))] = b;
  vocab["\xC4\xA0"] = 32;  // Ġ: space
  vocab["\xC4\x8A"] = 10;  // Ċ: newline
  vocab["<s>"] = 0;
  vocab["<pad>"] = 1;
  vocab["</s>"] = 2;
  vocab["<unk>"] = 3;
  std::ofstream(dir / "vocab.json") << vocab.dump();
  std::ofstream(dir / "merges.txt") << "#version: 0.2\n";
  std::ofstream(dir / "special_tokens_map.json")
      << R"({"bos_token": "</s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"})";
  return io::BpeTokenizer::from_folder(dir.string());
}

}  // namespace kuafu::testing

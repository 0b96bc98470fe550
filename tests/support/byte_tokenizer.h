// A tiny byte-level BPE tokenizer folder for tests: the bytes below 128 as single-byte tokens (id = the
// byte; no merges) but OPT's special tokens <s> 0, <pad> 1, </s> 2, <unk> 3 (or GPT-2's one,
// <|endoftext|> 0, with no pad token), so each character is one id and expected ids can be worked out by
// hand.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "core/io/bpe_tokenizer.h"

namespace kuafu::testing {

enum class SpecialTokens { kOpt, kGpt2 };

inline io::BpeTokenizer write_byte_tokenizer(const std::filesystem::path& dir, SpecialTokens specials = SpecialTokens::kOpt) {
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 33; b <= 126; ++b) vocab[std::string(1, static_cast<char>(b))] = b;
  vocab["\xC4\xA0"] = 32;  // Ġ: space
  vocab["\xC4\x8A"] = 10;  // Ċ: newline
  const bool gpt2 = specials == SpecialTokens::kGpt2;
  // Every other id below 128 a byte too (GPT-2's byte symbols: byte b < 33 is U+0100 + b, byte 127 is
  // U+0121), so a model of 128 rows samples no id the tokenizer lacks (an id it lacks fails decoding).
  auto symbol = [](int code) { return std::string{static_cast<char>(0xC0 | (code >> 6)), static_cast<char>(0x80 | (code & 0x3F))}; };
  for (int b = gpt2 ? 1 : 4; b < 32; ++b) {
    if (b != 10) vocab[symbol(0x100 + b)] = b;
  }
  vocab[symbol(0x121)] = 127;
  if (gpt2) {
    vocab["<|endoftext|>"] = 0;
  } else {
    vocab["<s>"] = 0;
    vocab["<pad>"] = 1;
    vocab["</s>"] = 2;
    vocab["<unk>"] = 3;
  }
  std::ofstream(dir / "vocab.json") << vocab.dump();
  std::ofstream(dir / "merges.txt") << "#version: 0.2\n";
  std::ofstream(dir / "special_tokens_map.json")
      << (gpt2 ? R"({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"})"
               : R"({"bos_token": "</s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"})");
  return io::BpeTokenizer::from_folder(dir.string());
}

}  // namespace kuafu::testing

// A small byte-level BPE tokenizer for the harnesses of data files (instructions, preference pairs):
// GPT-2's 256 byte symbols, a few merges and "<|endoftext|>", written as vocab.json and merges.txt and
// read by BpeTokenizer::from_files, so every UTF-8 text the fuzzer writes has tokens.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "core/io/bpe_tokenizer.h"
#include "fuzz/fuzz_support.h"

namespace kuafu::fuzz {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for 256 + n.
inline std::string byte_symbol(int byte) {
  const bool printable = (byte >= 0x21 && byte <= 0x7e) || (byte >= 0xa1 && byte <= 0xac) || byte >= 0xae;
  int code = byte;
  if (!printable) {
    int shifted = 0;
    for (int b = 0; b < byte; ++b) {
      shifted += !((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae);
    }
    code = 256 + shifted;
  }
  std::string utf8;  // code < 0x800: one or two bytes
  if (code < 0x80) {
    utf8 += static_cast<char>(code);
  } else {
    utf8 += static_cast<char>(0xc0 | (code >> 6));
    utf8 += static_cast<char>(0x80 | (code & 0x3f));
  }
  return utf8;
}

inline io::BpeTokenizer byte_tokenizer(const Scratch& scratch) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(b)] = b;
  const char* merges[] = {"h e", "l l", "he ll", "hell o", "Ġ t", "Ġt h", "Ġth e"};  // Ġ: the space
  std::string merges_txt = "#version: 0.2\n";
  int64_t id = 256;
  for (const char* merge : merges) {
    std::string line = merge;
    merges_txt += line + "\n";
    line.erase(line.find(' '), 1);
    vocab[line] = id++;
  }
  vocab["<|endoftext|>"] = id;
  return io::BpeTokenizer::from_files(scratch.write("vocab.json", vocab.dump()), scratch.write("merges.txt", merges_txt),
                                      {"<|endoftext|>"});
}

}  // namespace kuafu::fuzz

// Byte-level BPE files (core/io/bpe_tokenizer): the bytes as vocab.json, a line "#--merges.txt", then
// merges.txt, read with "<|endoftext|>" special; a tokenizer that loads then encodes a fixed text and
// must decode it back unchanged (its documented promise) whenever encoding succeeds.
#include <cstdlib>

#include "core/io/bpe_tokenizer.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("bpe_files");
  const auto [vocab, merges] = kuafu::fuzz::split_at(kuafu::fuzz::as_text(data, size), "\n#--merges.txt\n");
  const std::string vocab_path = scratch.write("vocab.json", vocab), merges_path = scratch.write("merges.txt", merges);
  kuafu::fuzz::expect_named_errors([&] {
    const auto tokenizer = kuafu::io::BpeTokenizer::from_files(vocab_path, merges_path, {"<|endoftext|>"});
    const std::string text = "hello there, it's 42 <|endoftext|> the héllo  \n\tend";
    const std::vector<int64_t> ids = tokenizer.encode(text);
    if (tokenizer.decode(ids) != text) std::abort();
  });
  return 0;
}

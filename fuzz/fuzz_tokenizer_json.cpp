// tokenizer.json (core/io/bpe_tokenizer, Hugging Face `tokenizers`' single file): the bytes as the
// file, read; a tokenizer that loads then encodes and decodes a fixed text.
#include "core/io/bpe_tokenizer.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("tokenizer_json");
  const std::string path = scratch.write("tokenizer.json", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] {
    const auto tokenizer = kuafu::io::BpeTokenizer::from_tokenizer_json(path);
    tokenizer.decode(tokenizer.encode("Hello there, it's 42 <|endoftext|> the Héllo  \n\tend"));
  });
  return 0;
}

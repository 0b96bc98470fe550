// tokenizer.model (core/io/sentencepiece_model, a SentencePiece model file): the bytes as the model of a
// folder without tokenizer.json, read as transformers' LlamaTokenizer reads it; a tokenizer that loads
// then encodes and decodes a fixed text.
#include "core/io/bpe_tokenizer.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("sentencepiece_model");
  scratch.write("tokenizer.model", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] {
    const auto tokenizer = kuafu::io::BpeTokenizer::from_folder(scratch.dir());
    tokenizer.decode(tokenizer.encode("Hello there, it's 42 </s> the H\xC3\xA9llo  \n\tend <s>"));
  });
  return 0;
}

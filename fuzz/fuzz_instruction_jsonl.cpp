// Instruction JSONL (core/io/instruction_data): the bytes as a JSONL file of prompt/response or
// messages rows, read and tokenized as OPT's fine-tuning reads it (BOS, EOS, a length limit).
#include "core/io/instruction_data.h"
#include "fuzz/byte_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("instruction_jsonl");
  static const kuafu::io::BpeTokenizer tokenizer = kuafu::fuzz::byte_tokenizer(scratch);
  static const kuafu::io::InstructionFormat format = [] {
    kuafu::io::InstructionFormat f;
    f.eos = *tokenizer.token_id("<|endoftext|>");
    f.bos = f.eos;
    f.max_tokens = 256;
    return f;
  }();
  const std::string path = scratch.write("instructions.jsonl", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] { kuafu::io::read_instructions(path, tokenizer, format); });
  return 0;
}

// Preference-pair JSONL (apps/chat_rlhf/preference_data): the bytes as a JSONL file of
// prompt/chosen/rejected(/kind) rows, read and tokenized as the reward and DPO stages read it, then
// laid out as model rows.
#include "apps/chat_rlhf/preference_data.h"
#include "fuzz/byte_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("preference_jsonl");
  static const kuafu::io::BpeTokenizer tokenizer = kuafu::fuzz::byte_tokenizer(scratch);
  static const kuafu::io::InstructionFormat format = [] {
    kuafu::io::InstructionFormat f;
    f.eos = *tokenizer.token_id("<|endoftext|>");
    f.max_tokens = 256;
    return f;
  }();
  const std::string path = scratch.write("pairs.jsonl", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] {
    const kuafu::chat::PreferenceSet set = kuafu::chat::read_preferences(path, tokenizer, format);
    std::vector<size_t> all(set.pairs.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    kuafu::chat::pair_rows(set, all, format.eos, torch::kCPU);
  });
  return 0;
}

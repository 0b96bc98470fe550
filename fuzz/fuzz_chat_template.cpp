// Chat templates (core/io/chat_template, tokenizer_config.json's "chat_template"): the bytes as a
// template, parsed, then rendered for a short conversation with the generation prompt.
#include "core/io/chat_template.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = {
      {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Héllo <think>x</think> 42"}}}},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
  kuafu::fuzz::expect_named_errors([&] {
    kuafu::io::ChatTemplate::parse(std::string(kuafu::fuzz::as_text(data, size)), "chat_template").render(context);
  });
  return 0;
}

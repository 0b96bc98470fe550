// PEFT adapter_config.json (core/train/peft_adapter_config): the bytes as an adapter folder's
// adapter_config.json, read into a LoRA spec. The folder holds no weights, so the spec alone is checked.
#include <torch/torch.h>

#include "core/train/peft_adapter.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("adapter_config");
  scratch.write(kuafu::train::kAdapterConfigFile, kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] { kuafu::train::read_adapter_config(scratch.dir()); });
  return 0;
}

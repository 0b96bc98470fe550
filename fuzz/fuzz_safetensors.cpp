// safetensors (core/io/safetensors): the bytes as a file, loaded, then each floating tensor checked
// for loading into float32 weights as checkpoints and model folders do.
#include <torch/torch.h>

#include "core/io/safetensors.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("safetensors");
  const std::string path = scratch.write("model.safetensors", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] {
    const kuafu::io::SafetensorsFile file = kuafu::io::load_safetensors(path);
    for (const auto& [name, tensor] : file.tensors) {
      if (tensor.is_floating_point()) kuafu::io::check_loadable(path, name, tensor, torch::kFloat32);
    }
  });
  return 0;
}

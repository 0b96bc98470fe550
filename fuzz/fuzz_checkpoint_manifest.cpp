// Checkpoint manifests (core/train/checkpoint_manifest): the bytes as manifest.json of a checkpoint
// folder that holds the files a real one does (model, optimizer, trainer state), then verified.
#include "core/train/checkpoint_manifest.h"
#include "fuzz/fuzz_support.h"

namespace {

// The folder's other files, fixed, so that seeds can name them with their true sizes and CRC-32s.
void write_checkpoint_files(const kuafu::fuzz::Scratch& scratch) {
  scratch.write("model.safetensors", std::string(8, '\0'));
  scratch.write("optimizer.safetensors", "optimizer state");
  scratch.write("trainer.json", "{\"step\": 2}");
  std::filesystem::create_directories(scratch.path("subfolder"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("checkpoint_manifest");
  static const bool ready = (write_checkpoint_files(scratch), true);
  (void)ready;
  scratch.write(kuafu::train::kManifestFile, kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] { kuafu::train::verify_manifest(scratch.dir()); });
  return 0;
}

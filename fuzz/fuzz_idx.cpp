// IDX files (core/io/idx_file, MNIST's format): the bytes as a file, plain or gzipped (the reader tells
// them apart by the gzip magic, so the corpus holds both).
#include "core/io/idx_file.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("idx");
  const std::string path = scratch.write("images.idx", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] { kuafu::io::read_idx(path); });
  return 0;
}

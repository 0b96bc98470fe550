// PNG text chunks (core/io/png_file): the bytes as a file, read for their tEXt fields as a sample
// grid's metadata is read back.
#include "core/io/png_file.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("png_text");
  const std::string path = scratch.write("grid.png", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] { kuafu::io::read_png_text(path); });
  return 0;
}

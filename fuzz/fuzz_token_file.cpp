// Token files (core/io/token_file): the bytes as a file, opened with the id check, then read as the
// loaders and the GPT app read it: single ids, a window, the unigram entropy.
#include <algorithm>
#include <vector>

#include "core/io/token_file.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("token_file");
  const std::string path = scratch.write("tokens.tok", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] {
    const auto file = kuafu::io::TokenFile::open(path);
    const uint64_t window = std::min<uint64_t>(file.size(), 4096);
    std::vector<int64_t> ids(window);
    file.copy_window(file.size() - window, window, ids.data());
    if (file.size() > 0) file.at(file.size() - 1);
    kuafu::io::unigram_entropy_nats(file);
  });
  return 0;
}

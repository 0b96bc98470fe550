#include "core/io/text_split.h"

#include <fstream>

#include "core/util/error.h"

namespace kuafu::io {

TextSplit split_text_blocks(const std::string& path, int64_t val_every) {
  KUAFU_CHECK(val_every >= 2, "the validation share must be every 2nd block or rarer, got ", val_every);
  std::ifstream in(path);
  KUAFU_CHECK(in, "cannot read ", path);
  TextSplit split;
  std::string line;
  for (int64_t index = 0; std::getline(in, line); ++index) {
    ((index / 100) % val_every == val_every - 1 ? split.val : split.train) += line + "\n";
  }
  KUAFU_CHECK(!split.val.empty() && !split.train.empty(), path, " is too short to split into train and validation");
  return split;
}

}  // namespace kuafu::io

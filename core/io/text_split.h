// Splitting a text file into training and validation text by blocks of lines, so validation reads
// continuous passages and no line is in both.
#pragma once

#include <cstdint>
#include <string>

namespace kuafu::io {

struct TextSplit {
  std::string train, val;
};

// Every `val_every`-th block of 100 lines goes to validation. kuafu::Error naming the file when it
// cannot be read or gives either part nothing.
TextSplit split_text_blocks(const std::string& path, int64_t val_every);

}  // namespace kuafu::io

// The tokenizer tests' text and references: the King James Bible (data/kjv/export.sh, from Debian's
// bible-kjv) and tests/python/bpe_reference.py's commands run on it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/support/python_reference.h"

namespace kuafu::io {

// The Bible as <dir>/kjv/kjv.txt.
inline void export_bible(const std::filesystem::path& dir) {
  const std::string exported = std::string(KUAFU_SOURCE_DIR) + "/data/kjv/export.sh " + (dir / "kjv").string() + " > /dev/null";
  ASSERT_EQ(std::system(exported.c_str()), 0) << "data/kjv/export.sh needs Debian's bible-kjv (scripts/setup)";
}

// bpe_reference.py's `command` on the exported Bible, writing its tokenizers and expected files in `dir`.
inline void bpe_reference_on_bible(const std::filesystem::path& dir, const std::string& command) {
  ASSERT_NO_FATAL_FAILURE(export_bible(dir));
  const testing::PythonRun run =
      testing::run_python_reference("bpe_reference.py", command + " " + (dir / "kjv/kjv.txt").string() + " " + dir.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
}

}  // namespace kuafu::io

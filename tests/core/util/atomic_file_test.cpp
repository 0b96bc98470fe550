// Atomic writes leave either the new file or nothing: a write that cannot be renamed into place (the
// path names a folder) leaves no temporary beside it and keeps what was there.
#include "core/util/atomic_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace kuafu {
namespace {
namespace fs = std::filesystem;

class AtomicFileTest : public testing::TempDirTest {
 protected:
  AtomicFileTest() : TempDirTest("atomic_file_") {}
};

TEST_F(AtomicFileTest, AWriteOntoAFolderFailsAndLeavesNothingBehind) {
  const fs::path folder = dir_ / "grid.png";
  fs::create_directory(folder);
  std::ofstream(folder / "kept.txt") << "kept";
  const std::string error = testing::expected_error([&] { write_file_atomic(folder.string(), "bytes"); });
  EXPECT_TRUE(testing::Contains(error, folder.string()));
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir_)) left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"grid.png"});
  EXPECT_TRUE(fs::is_regular_file(folder / "kept.txt"));
}

TEST_F(AtomicFileTest, AWriteReplacesAFileWhole) {
  write_file_atomic(path("a.txt"), "first");
  write_file_atomic(path("a.txt"), "second");
  EXPECT_EQ(read_file(path("a.txt")), "second");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator{}), 1);
}

}  // namespace
}  // namespace kuafu

// config.json values as the apps read them (io::config_value, io::config_required): where a count
// belongs, a number with a fraction or beyond 64 bits is named. Before, fuzz_hf_config found 1e300 for
// a count reaching a float-to-integer conversion out of range (undefined behaviour), and 2.5 became 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/io/hf_folder.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {
namespace fs = std::filesystem;

TEST(HfConfigTest, ACountWrittenWithAFractionOrBeyond64BitsIsNamed) {
  const fs::path dir = testing::temp_dir("hf_config_counts");
  std::ofstream(dir / "config.json") << R"({"n_embd": 1e300, "n_head": 2.5, "n_layer": 4, "resid_pdrop": 1, "tie": true})";
  const nlohmann::json config = read_hf_config(dir.string());
  const std::string where = (dir / "config.json").string();
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { config_value<int64_t>(config, "n_embd", 0, where); }),
                                where + ": \"n_embd\" = 1e+300 must be a whole number"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { config_required<int64_t>(config, "n_head", where); }),
                                "\"n_head\" = 2.5 must be a whole number"));
  // Whole numbers still read as counts, and an integer where a float belongs is still a float.
  EXPECT_EQ(config_value<int64_t>(config, "n_layer", 0, where), 4);
  EXPECT_EQ(config_value<double>(config, "resid_pdrop", 0.1, where), 1.0);
  EXPECT_TRUE(config_value<bool>(config, "tie", false, where));
}

}  // namespace
}  // namespace kuafu::io

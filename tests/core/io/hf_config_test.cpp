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

// generation_config.json's eos_token_id as transformers reads it: one id or a list (Qwen2.5, Llama 3.1
// Instruct list two or three); no file or no key: none; anything else named.
TEST(HfConfigTest, GenerationConfigGivesOneOrManyEosIds) {
  const fs::path dir = testing::temp_dir("hf_generation_config");
  EXPECT_TRUE(generation_eos_ids(dir.string()).empty());
  auto with = [&](const std::string& json) {
    std::ofstream(dir / "generation_config.json") << json;
    return generation_eos_ids(dir.string());
  };
  EXPECT_EQ(with(R"({"eos_token_id": 7})"), std::vector<int64_t>{7});
  EXPECT_EQ(with(R"({"bos_token_id": 1, "eos_token_id": [151645, 151643]})"), (std::vector<int64_t>{151645, 151643}));
  EXPECT_TRUE(with(R"({"bos_token_id": 1})").empty());
  EXPECT_TRUE(with(R"({"eos_token_id": null})").empty());
  const std::string where = (dir / "generation_config.json").string();
  for (const std::string bad : {R"({"eos_token_id": "</s>"})", R"({"eos_token_id": [2, -1]})", R"({"eos_token_id": [2.5]})"}) {
    EXPECT_TRUE(testing::Contains(testing::expected_error([&] { with(bad); }), where + ": eos_token_id must be a token id")) << bad;
  }
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { with("[1, 2]"); }), where + ": expected a JSON object"));
}

}  // namespace
}  // namespace kuafu::io

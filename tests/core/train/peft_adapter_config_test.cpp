// A PEFT adapter folder's adapter_config.json (train::read_adapter_config): an "r" that is no whole
// number is named. Before, fuzz_adapter_config found "r": 1e30 reaching a float-to-integer conversion
// out of range (undefined behaviour) before the bounds of lora.rank were checked.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/train/peft_adapter.h"
#include "tests/support/test_util.h"

namespace kuafu::train {
namespace {
namespace fs = std::filesystem;

TEST(PeftAdapterConfigTest, ARankThatIsNoWholeNumberIsNamed) {
  const fs::path dir = testing::temp_dir("adapter_rank");
  for (const auto& [rank, shown] : {std::pair<const char*, const char*>{"1e30", "1e+30"}, {"7.5", "7.5"}}) {
    std::ofstream(dir / "adapter_config.json")
        << R"({"peft_type": "LORA", "r": )" << rank << R"(, "target_modules": ["q_proj", "v_proj"]})";
    EXPECT_TRUE(testing::Contains(testing::expected_error([&] { read_adapter_config(dir.string()); }),
                                  "adapter_config.json: \"r\" = " + std::string(shown) + " must be a whole number"));
  }
  std::ofstream(dir / "adapter_config.json") << R"({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]})";
  EXPECT_EQ(read_adapter_config(dir.string()).rank, 4);
}

}  // namespace
}  // namespace kuafu::train

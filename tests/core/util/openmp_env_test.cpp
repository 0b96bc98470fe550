// Which OpenMP variables a Kuafu executable sets before it restarts itself (openmp_env.h). That libgomp
// honours them is shown by a benchmark line from a fresh process (GPTCliTest) and by the decoding figures
// in the README; here, the choice for each starting environment.
#include "core/util/openmp_env.h"

#include <gtest/gtest.h>

namespace kuafu {
namespace {

using Settings = std::map<std::string, std::string>;

// An environment holding `set` and nothing else.
std::function<const char*(const char*)> environment(const Settings& set) {
  return [set](const char* name) -> const char* {
    const auto found = set.find(name);
    return found == set.end() ? nullptr : found->second.c_str();
  };
}

TEST(OpenMpEnvTest, AnUnsetPolicyBecomesPassiveWithAShortSpinFirst) {
  EXPECT_EQ(openmp_settings_to_add(environment({})),
            (Settings{{"OMP_WAIT_POLICY", "passive"}, {"GOMP_SPINCOUNT", kOpenMpSpinCount}}));
}

TEST(OpenMpEnvTest, TheUsersSpinCountIsKept) {
  EXPECT_EQ(openmp_settings_to_add(environment({{"GOMP_SPINCOUNT", "0"}})), (Settings{{"OMP_WAIT_POLICY", "passive"}}));
}

// A policy already set is the user's choice or this process's restart: nothing more is set, so no second restart.
TEST(OpenMpEnvTest, ASetPolicyLeavesEverythingAsItIs) {
  EXPECT_TRUE(openmp_settings_to_add(environment({{"OMP_WAIT_POLICY", "active"}})).empty());
  EXPECT_TRUE(openmp_settings_to_add(environment({{"OMP_WAIT_POLICY", "passive"}})).empty());
}

}  // namespace
}  // namespace kuafu

// `kuafu-chat benchmark` on a tiny OPT: one JSON line timing each part of a PPO iteration (generation with
// and without the KV cache, the experience passes, an update of actor and critic) with the four models as
// a run holds them. Under Gemini the actor and the critic each report their own ledger; the offloaded
// reference keeps exactly its weights' bytes in host memory (its parameters x 4 bytes in float32: the
// figure the capacity benchmark subtracts from the footprint), the reward model kept on the device none.
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "tests/apps/chat_rlhf/stage_runs.h"
#include "tests/support/multiprocess.h"

namespace kuafu::chat {
namespace {

nlohmann::json benchmark_line(const fs::path& root, const std::string& name, const std::string& memory) {
  const fs::path config = write_config(root, name,
      common_config(root, name + "_run", 1, "") +
      "[model]\nhidden_size = 64\nnum_hidden_layers = 2\nnum_attention_heads = 4\nffn_dim = 128\nvocab_size = 512\n"
      "[generate]\nmax_new_tokens = 8\ntemperature = 1.0\n[rl]\nprompts_per_rollout = 8\n[benchmark]\nsteps = 1\nwarmup = 0\n" + memory);
  const testing::CommandResult run = chat("benchmark --config " + config.string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const std::string& out = run.output;
  const size_t last = out.rfind("{\"");
  if (last == std::string::npos) return {};
  return nlohmann::json::parse(out.substr(last, out.find('\n', last) - last));
}

TEST(ChatBenchmarkTest, TimesEachPartWithTheFourModelsAsARunHoldsThem) {
  const fs::path root = testing::shared_test_dir("chat_benchmark");
  write_data(root);
  const nlohmann::json plain = benchmark_line(root, "plain", "");
  const nlohmann::json gemini = benchmark_line(root, "gemini",
      "[memory]\nstrategy = \"gemini\"\n[models.critic.memory]\nstrategy = \"gemini\"\n"
      "[models.reference.memory]\noffload_frozen = true\n");
  ASSERT_FALSE(plain.is_null());
  ASSERT_FALSE(gemini.is_null());
  for (const nlohmann::json* line : {&plain, &gemini}) {
    EXPECT_EQ((*line)["new_tokens"], 8);
    EXPECT_EQ((*line)["rollout_rows"], 8);
    for (const char* key : {"generate_tokens_per_s_kv_cache", "generate_tokens_per_s_no_cache", "experience_s",
                            "step_time_ms_median", "steps_peak_in_use_mb"}) {
      EXPECT_GT((*line)[key].get<double>(), 0.0) << key << " " << line->dump();
    }
    EXPECT_GE((*line)["ppo_iteration_s"].get<double>(),
              (*line)["generate_s_kv_cache"].get<double>() + (*line)["experience_s"].get<double>());
  }
  EXPECT_EQ(plain["memory_strategy"], "none");
  EXPECT_FALSE(plain.contains("critic.device_peak_mb")) << plain.dump();
  EXPECT_EQ(plain["reference_host_mb"].get<double>(), 0.0);
  EXPECT_EQ(gemini["memory_strategy"], "gemini");
  EXPECT_EQ(gemini["critic_memory_strategy"], "gemini");
  EXPECT_GT(gemini["device_peak_mb"].get<double>(), 0.0);
  EXPECT_GT(gemini["critic.device_peak_mb"].get<double>(), 0.0);
  EXPECT_TRUE(gemini["reference_offloaded"].get<bool>());
  EXPECT_FALSE(gemini["reward_offloaded"].get<bool>());
  EXPECT_DOUBLE_EQ(gemini["reference_host_mb"].get<double>(), gemini["parameters"].get<double>() * 4 / (1 << 20));
  EXPECT_EQ(gemini["reward_host_mb"].get<double>(), 0.0);
}

}  // namespace
}  // namespace kuafu::chat

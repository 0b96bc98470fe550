// Rewards a program checks (rl.rewards), each against cases worked by hand: the answer extracted from a
// response (the last match, its first group), answers equal as numbers or as trimmed text, DAPO's overlong
// penalty on both sides of its buffer, the weighted sum, and the config's mistakes named at their keys.
#include <gtest/gtest.h>

#include "apps/chat_rlhf/stage_config.h"
#include "apps/chat_rlhf/verifiable_rewards.h"
#include "tests/support/test_util.h"

namespace kuafu::chat {
namespace {

config::Config grpo_config(const std::string& rl) {
  return config::Config::from_string("[generate]\nmax_new_tokens = 16\ntemperature = 1.0\n[rl]\n" + rl, "test.toml", stage_schema(Stage::Grpo));
}

TEST(VerifiableRewardsTest, AnswersAreExtractedAndComparedAsWorkedByHand) {
  const VerifiableRewards defaults = read_verifiable_rewards(grpo_config("rewards = [\"exact_answer\"]\n"));
  // The last number of the response, thousands commas and a final full stop allowed.
  EXPECT_EQ(extract_answer("3 apples and 4 pears make 7.", defaults.answer_pattern), "7");
  EXPECT_EQ(extract_answer("It costs -1,250.50 dollars", defaults.answer_pattern), "-1,250.50");
  EXPECT_EQ(extract_answer("no number here", defaults.answer_pattern), std::nullopt);
  EXPECT_TRUE(same_answer("1,000", "1000.0"));
  EXPECT_TRUE(same_answer(" 42. ", "42"));
  EXPECT_FALSE(same_answer("41", "42"));
  EXPECT_TRUE(same_answer("a bird", "a bird."));
  EXPECT_FALSE(same_answer("a bird", "a bard"));
  EXPECT_FALSE(same_answer("", "")) << "an empty reference matches nothing";
  EXPECT_EQ(defaults.score("so 6 x 7 = 42", 9, "42"), 1.0);
  EXPECT_EQ(defaults.score("so 6 x 7 = 42, or 43", 9, "42"), 0.0) << "the last number counts";

  // A pattern's first group: GSM8K's "#### answer".
  const VerifiableRewards marked = read_verifiable_rewards(grpo_config("rewards = [\"exact_answer\"]\nanswer_pattern = \"####\\\\s*(\\\\S+)\"\n"));
  EXPECT_EQ(extract_answer("first #### 3 then #### 12", marked.answer_pattern), "12");
  EXPECT_EQ(marked.score("work... #### 12", 5, "12"), 1.0);
  EXPECT_EQ(marked.score("work... 12", 5, "12"), 0.0);
}

TEST(VerifiableRewardsTest, FormatOverlongAndTheWeightedSumAsWorkedByHand) {
  // DAPO's soft overlong punishment, L_max 16 and a buffer of 4: 0 up to 12 tokens, then (12 − L) / 4.
  EXPECT_EQ(overlong_penalty(12, 16, 4), 0.0);
  EXPECT_EQ(overlong_penalty(13, 16, 4), -0.25);
  EXPECT_EQ(overlong_penalty(15, 16, 4), -0.75);
  EXPECT_EQ(overlong_penalty(16, 16, 4), -1.0);
  EXPECT_EQ(overlong_penalty(30, 16, 0), 0.0);
  const VerifiableRewards r = read_verifiable_rewards(grpo_config(
      "rewards = [\"exact_answer\", \"format\", \"overlong\"]\nreward_weights = [1.0, 0.5, 2.0]\n"
      "format_pattern = \"^<think>[\\\\s\\\\S]*</think>\"\noverlong_buffer = 4\n"));
  ASSERT_EQ(r.terms.size(), 3u);
  EXPECT_TRUE(r.checks_answers());
  EXPECT_DOUBLE_EQ(r.score("<think>2+2</think> 4", 10, "4"), 1.0 + 0.5);
  EXPECT_DOUBLE_EQ(r.score("<think>2+2</think> 5", 14, "4"), 0.5 + 2.0 * -0.5);
  EXPECT_DOUBLE_EQ(r.score("4 <think></think>", 16, "4"), 1.0 + 2.0 * -1.0) << "the format is anchored at the start";
}

TEST(VerifiableRewardsTest, MistakesAreNamedAtTheirKeys) {
  const auto error = [](const std::string& rl) { return testing::error_message([&] { read_verifiable_rewards(grpo_config(rl)); }); };
  EXPECT_TRUE(testing::Contains(error("rewards = [\"exact\"]\n"), "rl.rewards")) << error("rewards = [\"exact\"]\n");
  EXPECT_TRUE(testing::Contains(error("rewards = [\"format\"]\nreward_weights = [1.0, 2.0]\nformat_pattern = \"x\"\n"),
                                "has 2 weights for the 1 terms"));
  EXPECT_TRUE(testing::Contains(error("rewards = [\"format\"]\n"), "rl.format_pattern"));
  EXPECT_TRUE(testing::Contains(error("rewards = [\"exact_answer\"]\nanswer_pattern = \"(unclosed\"\n"),
                                "is not a regular expression"));
  EXPECT_TRUE(testing::Contains(error("rewards = [\"overlong\"]\noverlong_buffer = 17\n"), "must lie in 1..generate.max_new_tokens (16)"));
  const std::string neither = testing::error_message([] {
    const config::Config config = grpo_config("");
    require_rewards(config, rl_settings(config, Stage::Grpo));
  });
  EXPECT_TRUE(testing::Contains(neither, "rl.reward_model")) << neither;
  EXPECT_TRUE(testing::Contains(neither, "rl.rewards names no term")) << neither;
}

}  // namespace
}  // namespace kuafu::chat

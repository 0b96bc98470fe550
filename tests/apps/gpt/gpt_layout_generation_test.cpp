// Generation under the run's layout, as PPO samples from the actor it trains: greedy tokens of a batch
// whose rows stop at different lengths equal the serial model's
//  - with the weights Gemini-sharded over 2 data ranks, each rank decoding its own rows: the chunks are
//    gathered around every part of every decoding step, and a rank whose rows have all stopped keeps
//    decoding until the other's have (otherwise the other would wait for its gathers forever);
//  - with 1D tensor parallelism over 2 ranks (every rank the same rows).
// Greedy decoding takes the argmax of logits that differ only in summation order: the tokens are equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "apps/gpt/model.h"
#include "core/train/model_state.h"
#include "core/train/parallelize.h"
#include "core/train/trainer.h"
#include "tests/support/multiprocess.h"
#include "tests/support/worker_world.h"

namespace kuafu::gpt {
namespace {

using Rows = std::vector<std::vector<int64_t>>;

GPTConfig generation_gpt_config() {
  GPTConfig c;
  c.vocab_size = 50;
  c.n_positions = 32;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  return c;
}

// The tiny random model mostly repeats a prompt's last token: rank 0's rows (ending in 3) stop at once
// on the stop token chosen below, rank 1's run to the limit.
const Rows kPrompts = {{1, 2, 3}, {4, 3}, {5, 6, 7, 8}, {9, 10}};

config::Config layout_config(const std::vector<std::string>& overrides) {
  config::Schema schema;
  train::add_runtime_schema(schema);
  train::add_trainer_schema(schema);
  return config::Config::from_string("[optim]\nname = \"sgd\"\n[runtime]\nthreads = 1\ndevice = \"cpu\"\n"
                                     "[dist]\ntimeout_s = 30\n",
                                     "layout.toml", schema, overrides);
}

// The serial model's greedy rows with a stop token both of rank 0's rows reach within 4 tokens and
// neither of rank 1's within 8 (so rank 0 stops decoding its own rows well before rank 1), and the token.
std::pair<Rows, int64_t> serial_rows() {
  torch::manual_seed(1);
  GPT serial(generation_gpt_config(), parallel::ModelOptions::serial_on(torch::kCPU));
  serial->eval();
  nn::SamplingOptions options;
  options.temperature = 0;
  options.max_new_tokens = 12;
  const Rows full = nn::generate(decoder(serial), kPrompts, options);
  auto within = [&](size_t row, size_t n, int64_t token) {
    return std::find(full[row].begin(), full[row].begin() + static_cast<int64_t>(n), token) != full[row].begin() + static_cast<int64_t>(n);
  };
  std::optional<int64_t> stop;
  for (size_t i = 0; i < 4 && !stop; ++i) {
    const int64_t token = full[0][i];
    if (within(1, 4, token) && !within(2, 8, token) && !within(3, 8, token)) stop = token;
  }
  EXPECT_TRUE(stop) << "no token ends rank 0's rows early and rank 1's late; choose other prompts";
  options.stop_tokens = {stop.value_or(-1)};
  return {nn::generate(decoder(serial), kPrompts, options), options.stop_tokens[0]};
}

nn::SamplingOptions greedy_until(int64_t stop) {
  nn::SamplingOptions options;
  options.temperature = 0;
  options.max_new_tokens = 12;
  options.stop_tokens = {stop};
  return options;
}

TEST(GPTLayoutGenerationTest, GeminiShardedWeightsOnTwoRanksGiveTheSerialTokens) {
  if (!testing::is_worker()) {
    testing::run_test_on_ranks(2, 60);
    return;
  }
  const auto [expected, stop] = serial_rows();
  const int rank = testing::worker_rank();
  // Rank 0's rows end within 4 tokens; rank 1's run longer.
  const size_t rank0_longest = std::max(expected[0].size(), expected[1].size());
  const size_t rank1_longest = std::max(expected[2].size(), expected[3].size());
  ASSERT_LT(rank0_longest, rank1_longest);

  const config::Config config = layout_config({"memory.strategy=\"gemini\""});
  train::Runtime runtime = train::start_runtime(config, testing::worker_world());
  torch::manual_seed(1);
  GPT model(generation_gpt_config(), runtime.model_options());
  train::ParallelModel runner(*model, {});
  train::ModelStateOptions options;
  options.set_block_hooks = [&runner](hooks::BlockHooks* hooks) {
    runner.set_block_hooks(hooks);
    return true;
  };
  train::ModelState state(config, runtime, *model, options);
  model->eval();
  nn::Decoder sharded = decoder(model);
  sharded.all_done = nn::all_done_over(runtime.mesh->group("data"));
  const Rows mine = {kPrompts[2 * rank], kPrompts[2 * rank + 1]};
  const Rows produced = nn::generate(sharded, mine, greedy_until(stop));
  EXPECT_EQ(produced, (Rows{expected[2 * rank], expected[2 * rank + 1]}));
  // Between calls the weights are not held whole: the last block's chunk is released.
  EXPECT_EQ(model->transformer->blocks.back()->named_parameters()["mlp.c_fc.weight"].storage().nbytes(), 0u);
}

TEST(GPTLayoutGenerationTest, TensorParallelWeightsGiveTheSerialTokens) {
  if (!testing::is_worker()) {
    testing::run_test_on_ranks(2, 60);
    return;
  }
  const auto [expected, stop] = serial_rows();
  const config::Config config = layout_config({"parallel.tensor.mode=\"1d\"", "parallel.tensor.size=2"});
  train::Runtime runtime = train::start_runtime(config, testing::worker_world());
  torch::manual_seed(1);
  GPT model(generation_gpt_config(), runtime.model_options());
  model->eval();
  EXPECT_EQ(nn::generate(decoder(model), kPrompts, greedy_until(stop)), expected);
}

}  // namespace
}  // namespace kuafu::gpt

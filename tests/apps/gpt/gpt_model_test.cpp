// GPT-2 model: Hugging Face names and shapes, causality, the KV cache, the attention kernel against
// its formula, and the sampling filters worked by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include <ATen/CPUGeneratorImpl.h>

#include "apps/gpt/model.h"
#include "core/ops/fused_kernels.h"
#include "tests/apps/gpt/gpt_tiny_config.h"
#include "core/util/error.h"

namespace kuafu::gpt {
namespace {

TEST(GPTModelTest, HuggingFaceNamesShapesAndCount) {
  torch::manual_seed(0);
  GPT model(tiny_gpt_config());
  std::map<std::string, std::vector<int64_t>> shapes;
  int64_t total = 0;
  for (const auto& item : model->named_parameters()) {
    shapes[item.key()] = item.value().sizes().vec();
    total += item.value().numel();
  }
  EXPECT_EQ(shapes.at("transformer.wte.weight"), (std::vector<int64_t>{50, 32}));
  EXPECT_EQ(shapes.at("transformer.wpe.weight"), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(shapes.at("transformer.h.1.attn.c_attn.weight"), (std::vector<int64_t>{32, 96}));  // Conv1D [in, out]
  EXPECT_EQ(shapes.at("transformer.h.1.mlp.c_fc.weight"), (std::vector<int64_t>{32, 128}));
  EXPECT_EQ(shapes.at("transformer.h.0.mlp.c_proj.weight"), (std::vector<int64_t>{128, 32}));
  EXPECT_EQ(shapes.at("transformer.ln_f.bias"), (std::vector<int64_t>{32}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u) << "the output embedding is tied to wte";
  EXPECT_EQ(total, tiny_gpt_config().parameter_count());
  // GPT-2 124M: the published 124,439,808 parameters (tied head).
  GPTConfig small;
  EXPECT_EQ(small.parameter_count(), 124439808);
}

TEST(GPTModelTest, FutureTokensNeverChangeEarlierLogits) {
  torch::manual_seed(1);
  GPT model(tiny_gpt_config());
  model->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor tokens = torch::randint(50, {2, 12}, torch::kInt64);
  torch::Tensor changed = tokens.clone();
  changed.index_put_({torch::indexing::Slice(), torch::indexing::Slice(7, torch::indexing::None)},
                     torch::randint(50, {2, 5}, torch::kInt64));
  torch::Tensor a = model->forward(tokens), b = model->forward(changed);
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 7), b.narrow(1, 0, 7)));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 7, 5), b.narrow(1, 7, 5)));
}

TEST(GPTModelTest, AttentionKernelMatchesFormula) {
  torch::manual_seed(2);
  torch::Tensor q = torch::randn({2, 3, 5, 8}, torch::kFloat64), k = torch::randn({2, 3, 5, 8}, torch::kFloat64),
                v = torch::randn({2, 3, 5, 8}, torch::kFloat64);
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0);
  torch::Tensor mask = torch::ones({5, 5}, torch::kBool).triu(1);
  torch::Tensor expected = torch::matmul(torch::softmax(scores.masked_fill(mask, -INFINITY), -1), v);
  EXPECT_TRUE(torch::allclose(ops::scaled_dot_product_attention(q, k, v, true), expected, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(ops::scaled_dot_product_attention(q, k, v, false),
                              torch::matmul(torch::softmax(scores, -1), v), 1e-12, 1e-12));
  // Two queries at the end of five keys (decoding with a cache): the bottom rows of the causal result.
  EXPECT_TRUE(torch::allclose(ops::scaled_dot_product_attention(q.narrow(2, 3, 2), k, v, true),
                              expected.narrow(2, 3, 2), 1e-12, 1e-12));
}

// runtime.fused_loss: the model's loss through the fused output layer (ops::linear_cross_entropy) equals
// the plain logits and loss, value and every parameter's gradient, in float64 (summation order only:
// 1e-12 relative to each gradient's largest entry).
TEST(GPTModelTest, FusedLossGivesThePlainLossAndGradients) {
  torch::manual_seed(4);
  GPT model(tiny_gpt_config());
  model->to(torch::kFloat64);
  const torch::Tensor tokens = torch::randint(50, {3, 13}, torch::kInt64);
  auto loss_and_gradients = [&](bool fused) {
    ops::set_fused_kernels({fused, true, true});
    model->zero_grad();
    const torch::Tensor loss = model->loss(tokens.narrow(1, 0, 12), tokens.narrow(1, 1, 12));
    loss.backward();
    std::map<std::string, torch::Tensor> gradients;
    for (const auto& item : model->named_parameters()) gradients[item.key()] = item.value().grad().clone();
    return std::make_pair(loss.item<double>(), gradients);
  };
  const auto [plain_loss, plain_gradients] = loss_and_gradients(false);
  const auto [fused_loss, fused_gradients] = loss_and_gradients(true);
  EXPECT_NEAR(fused_loss, plain_loss, 1e-12 * plain_loss);
  for (const auto& [name, want] : plain_gradients) {
    const double scale = want.abs().max().item<double>();
    EXPECT_GT(scale, 0.0) << name;
    EXPECT_LE((fused_gradients.at(name) - want).abs().max().item<double>(), 1e-12 * scale) << name;
  }
}

TEST(GPTModelTest, KVCacheDecodingEqualsFullForward) {
  torch::manual_seed(3);
  GPT model(tiny_gpt_config());
  model->to(torch::kFloat64);
  model->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor tokens = torch::randint(50, {1, 10}, torch::kInt64);
  torch::Tensor full = model->forward(tokens);
  std::vector<ops::KVCache> caches;
  torch::Tensor prefix = model->forward(tokens.narrow(1, 0, 6), &caches);
  EXPECT_TRUE(torch::allclose(prefix, full.narrow(1, 0, 6), 1e-10, 1e-10));
  for (int64_t t = 6; t < 10; ++t) {
    torch::Tensor step = model->forward(tokens.narrow(1, t, 1), &caches);
    EXPECT_TRUE(torch::allclose(step.select(1, 0), full.select(1, t), 1e-10, 1e-10)) << "position " << t;
  }
  EXPECT_THROW(model->forward(torch::zeros({1, 7}, torch::kInt64), &caches), Error);  // 17 > n_positions
}

TEST(SamplingTest, TopKAndTopPKeepTheRightTokens) {
  // probabilities 0.5, 0.25, 0.125, 0.125 (logits are their logs)
  torch::Tensor logits = torch::log(torch::tensor({0.125, 0.5, 0.125, 0.25}, torch::kFloat64));
  auto kept = [](const torch::Tensor& l) { return torch::isfinite(l).to(torch::kInt64); };
  EXPECT_TRUE(torch::equal(kept(nn::filter_logits(logits, 2, 1.0)), torch::tensor({0, 1, 0, 1})));
  // top_p 0.6: 0.5 alone is below 0.6, so the 0.25 token is needed too; 0.75 >= 0.6 stops there.
  EXPECT_TRUE(torch::equal(kept(nn::filter_logits(logits, 0, 0.6)), torch::tensor({0, 1, 0, 1})));
  EXPECT_TRUE(torch::equal(kept(nn::filter_logits(logits, 0, 0.5)), torch::tensor({0, 1, 0, 0})));
  EXPECT_TRUE(torch::equal(kept(nn::filter_logits(logits, 0, 1.0)), torch::tensor({1, 1, 1, 1})));
}

TEST(SamplingTest, GreedyGenerationIsDeterministicAndUsesTheCache) {
  torch::manual_seed(4);
  GPT model(tiny_gpt_config());
  model->eval();
  nn::SamplingOptions options;
  options.max_new_tokens = 8;
  options.temperature = 0;
  const auto a = nn::generate(decoder(model), {1, 2, 3}, options);
  ASSERT_EQ(a.size(), 8u);
  // Greedy with the cache equals greedy by re-running the whole sequence each time.
  std::vector<int64_t> seq = {1, 2, 3};
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 8; ++i) {
    torch::Tensor logits = model->forward(torch::tensor(seq, torch::kInt64).unsqueeze(0));
    seq.push_back(logits.index({0, -1}).argmax().item<int64_t>());
  }
  EXPECT_EQ(std::vector<int64_t>(seq.begin() + 3, seq.end()), a);
}

// Left-padded rows decode at their own positions with their padding hidden: each row of a batch
// continues as its prompt alone does (greedy; prompts of 1, 5 and 3 tokens pad 4, 0 and 2 positions).
// Positions taken from arange instead of the padding mask change rows 0 and 2.
TEST(SamplingTest, BatchedGenerationContinuesEachPromptAsItDoesAlone) {
  torch::manual_seed(4);
  GPT model(tiny_gpt_config());
  model->eval();
  {
    // GPT-2's N(0, 0.02) weights barely mix the positions: the next token would follow from the last
    // one alone, whatever the padding. Larger weights make every token depend on its whole context.
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.mul_(8.0);
  }
  nn::SamplingOptions options;
  options.max_new_tokens = 10;  // the longest row's 5 + 10 tokens fit the 16 positions: no restart
  options.temperature = 0;
  const std::vector<std::vector<int64_t>> prompts = {{7}, {1, 2, 3, 4, 5}, {9, 8, 7}};
  std::vector<std::vector<int64_t>> alone;
  for (const auto& prompt : prompts) alone.push_back(nn::generate(decoder(model), prompt, options));
  EXPECT_EQ(nn::generate(decoder(model), prompts, options), alone);

  // A row that reaches any of the stop tokens ends there (keeping it); the others go on as before.
  options.stop_tokens = {alone[0][0], alone[2][3]};
  const auto stopped = nn::generate(decoder(model), prompts, options);
  EXPECT_EQ(stopped[0], std::vector<int64_t>{alone[0][0]});
  for (size_t r = 1; r < prompts.size(); ++r) {
    const auto end = std::find_first_of(alone[r].begin(), alone[r].end(), options.stop_tokens.begin(), options.stop_tokens.end());
    EXPECT_EQ(stopped[r], std::vector<int64_t>(alone[r].begin(), end == alone[r].end() ? end : end + 1)) << "row " << r;
  }
  EXPECT_LE(stopped[2].size(), 4u) << "row 2 stops at its fourth token at the latest";
}

// Sampling draws the rows in order from one seeded generator: the same batch gives the same tokens.
TEST(SamplingTest, BatchedSamplingIsReproducible) {
  torch::manual_seed(4);
  GPT model(tiny_gpt_config());
  model->eval();
  nn::SamplingOptions options;
  options.max_new_tokens = 6;
  options.top_k = 10;
  options.seed = 3;
  const std::vector<std::vector<int64_t>> prompts = {{7, 1}, {1, 2, 3, 4, 5}};
  const auto first = nn::generate(decoder(model), prompts, options);
  EXPECT_EQ(nn::generate(decoder(model), prompts, options), first);
  options.seed = 4;
  EXPECT_NE(nn::generate(decoder(model), prompts, options), first);
}

// sample_rows draws each row's token with probability softmax(logits): over 40,000 draws of three rows
// (one sure token; weights 1:2:3:4 with a −inf among them; two equal) each frequency is within 0.01 of
// its probability (binomial standard error at most 0.0025), and a token of probability 0 never comes.
TEST(SamplingTest, RowDrawsFollowTheSoftmax) {
  const double inf = std::numeric_limits<double>::infinity();
  const torch::Tensor logits = torch::tensor({{-inf, 0.0, -inf, -inf, -inf},
                                              {0.0, std::log(2.0), -inf, std::log(3.0), std::log(4.0)},
                                              {1.0, 1.0, -inf, -inf, -inf}}, torch::kFloat64);
  const torch::Tensor expected = torch::softmax(logits, 1);  // [3, 5]
  at::Generator generator = at::detail::createCPUGenerator(5);
  constexpr int kDraws = 40000;
  torch::Tensor counts = torch::zeros({3, 5}, torch::kFloat64);
  for (int i = 0; i < kDraws; ++i) {
    const torch::Tensor chosen = nn::sample_rows(logits, generator);  // [3]
    ASSERT_EQ(chosen.sizes(), (std::vector<int64_t>{3}));
    counts.scatter_add_(1, chosen.unsqueeze(1), torch::ones({3, 1}, torch::kFloat64));
  }
  EXPECT_LT((counts / kDraws - expected).abs().max().item<double>(), 0.01) << counts;
  EXPECT_EQ(counts.masked_select(expected.eq(0)).sum().item<double>(), 0.0) << counts;
}

// vocab_limit keeps sampling to the tokenizer's ids when the output layer has more rows (OPT): the
// tiny model's 50 rows, limited to 7, never give an id of 7 or more, greedy or sampled.
TEST(SamplingTest, NoTokenBeyondTheVocabularyLimitIsChosen) {
  torch::manual_seed(4);
  GPT model(tiny_gpt_config());
  model->eval();
  nn::SamplingOptions options;
  options.max_new_tokens = 12;
  options.seed = 9;
  options.vocab_limit = 7;
  for (double temperature : {0.0, 1.0, 5.0}) {
    options.temperature = temperature;
    for (const auto& row : nn::generate(decoder(model), {{1, 2, 3}, {40, 41}}, options)) {
      for (int64_t id : row) EXPECT_LT(id, 7) << "temperature " << temperature;
    }
  }
  // Without the limit the hot samples reach the other rows (the test above would see it).
  options.vocab_limit = 0;
  int64_t highest = 0;
  for (const auto& row : nn::generate(decoder(model), {{1, 2, 3}, {40, 41}}, options)) {
    for (int64_t id : row) highest = std::max(highest, id);
  }
  EXPECT_GE(highest, 7);
}

// Before: when the context filled, decoding restarted and the tokens produced so far were dropped
// from the result (30 asked for past a 16-position context gave 17).
TEST(SamplingTest, GenerationPastTheContextReturnsEveryNewToken) {
  torch::manual_seed(4);
  GPT model(tiny_gpt_config());
  model->eval();
  nn::SamplingOptions options;
  options.max_new_tokens = 30;
  options.seed = 5;
  EXPECT_EQ(nn::generate(decoder(model), {1, 2, 3}, options).size(), 30u);
  for (const auto& row : nn::generate(decoder(model), {{1, 2, 3}, {4}}, options)) EXPECT_EQ(row.size(), 30u);
}

}  // namespace
}  // namespace kuafu::gpt

// The three ways generation holds its key-value caches decode alike: growing caches (concatenated each
// step), reserved buffers written in place, and fixed shapes (the whole buffer read with its empty slots
// masked: the step a CUDA graph replays). GPT-2 and OPT (learned positions), Mistral-shaped Llama (rotary
// positions, grouped-query attention, a sliding window shorter than the sequence); left-padded rows and
// a restart when the context fills. Float64, so that the one difference between the paths, the order of
// a sum over the keys (masked slots add exact zeros), stays far below the 1e-10 bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "apps/opt_finetune/model.h"
#include "apps/opt_finetune/model_llama.h"
#include "core/nn/causal_lm.h"
#include "core/util/error.h"
#include "tests/apps/gpt/gpt_tiny_config.h"
#include "tests/support/devices.h"

namespace kuafu::opt {
namespace {

using Cache = nn::SamplingOptions::Cache;

struct Decoded {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<torch::Tensor> logits;     // per step [B, V]: each row's last position
  std::vector<int64_t> keys_lengths;     // per step: the first cache's keys as attention saw them
  std::vector<const void*> keys_storage;  // per step: where those keys live
  std::vector<bool> first;                // per step: whether it began new caches (the prompt, or a restart)
};

Decoded decode(const nn::CausalLMPtr& model, const std::vector<std::vector<int64_t>>& prompts, nn::SamplingOptions options,
               Cache cache) {
  nn::Decoder decoder = nn::decoder_of(model);
  Decoded out;
  const auto forward = decoder.forward;
  decoder.forward = [&](const nn::DecodeStep& step, std::vector<ops::KVCache>& caches) {
    out.first.push_back(caches.empty());
    torch::Tensor logits = forward(step, caches);  // [B, T, V]
    out.logits.push_back(logits.select(1, -1).clone());
    out.keys_lengths.push_back(caches[0].keys.size(2));
    out.keys_storage.push_back(caches[0].keys.storage().data());
    return logits;
  };
  options.cache = cache;
  out.tokens = nn::generate(decoder, prompts, options);
  return out;
}

// Weights scaled up (x8) so that every token depends on its whole context, float64, eval mode.
void prepare(torch::nn::Module& model) {
  model.to(torch::kFloat64);
  model.eval();
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.mul_(8.0);
}

// Prompts of 1, 5 and 3 tokens (left padding of 4, 0, 2) and new tokens past a 16- or 24-position context:
// the caches restart once or more. Greedy and sampled. On each device the tests see (CI: the CPU); on a
// GPU `kAuto` captures the step as a CUDA graph, whose replays never call the decoder's forward: there the
// tokens are compared (sampled tokens move with any logit beyond float64 rounding) and the calls counted.
void expect_layouts_decode_alike(const nn::CausalLMPtr& model, int64_t context) {
  const std::vector<std::vector<int64_t>> prompts = {{7}, {1, 2, 3, 4, 5}, {9, 8, 7}};
  for (const torch::Device& device : testing::devices_to_test()) {
    SCOPED_TRACE(device.str());
    model->module().to(device);
    for (const double temperature : {0.0, 1.0}) {
      SCOPED_TRACE(temperature > 0 ? "sampled" : "greedy");
      nn::SamplingOptions options;
      options.temperature = temperature;
      options.top_k = 0, options.top_p = 1.0, options.seed = 11;
      options.max_new_tokens = context + 6;
      const Decoded growing = decode(model, prompts, options, Cache::kGrowing);
      ASSERT_EQ(growing.tokens[1].size(), static_cast<size_t>(options.max_new_tokens));
      ASSERT_EQ(growing.logits.size(), static_cast<size_t>(options.max_new_tokens));
      // Growing caches are copied into a new tensor every step.
      EXPECT_NE(growing.keys_storage[3], growing.keys_storage[2]);
      for (const Cache layout : {Cache::kReserved, Cache::kFixedShape, Cache::kAuto}) {
        SCOPED_TRACE(layout == Cache::kReserved ? "reserved" : layout == Cache::kFixedShape ? "fixed shape" : "auto");
        const Decoded other = decode(model, prompts, options, layout);
        EXPECT_EQ(other.tokens, growing.tokens);
        if (layout == Cache::kAuto && device.is_cuda()) {
          EXPECT_LT(other.logits.size(), growing.logits.size() / 2) << "the steps were replayed, not run";
          continue;
        }
        ASSERT_EQ(other.logits.size(), growing.logits.size());
        for (size_t i = 0; i < growing.logits.size(); ++i) {
          EXPECT_LT((other.logits[i] - growing.logits[i]).abs().max().item<double>(), 1e-10) << "step " << i;
        }
        // The steps after the one that begins the caches (the prompt, or a restart) and the one that reserves
        // them keep their buffer: reserved caches give views of the filled slots of one storage, fixed-shape
        // ones the whole buffer each step.
        int64_t kept = 0;
        EXPECT_GE(std::count(other.first.begin(), other.first.end(), true), 2) << "the prompt and a restart at least";
        for (size_t i = 2; i < other.logits.size(); ++i) {
          if (other.first[i] || other.first[i - 1]) continue;
          ++kept;
          EXPECT_EQ(other.keys_storage[i], other.keys_storage[i - 1]) << "step " << i << " moved the cache";
          const int64_t growth = layout == Cache::kFixedShape ? 0 : 1;
          EXPECT_EQ(other.keys_lengths[i], other.keys_lengths[i - 1] + growth) << "step " << i;
        }
        EXPECT_GT(kept, context / 2);
      }
    }
  }
  model->module().to(torch::kCPU);
}

TEST(CacheLayoutsTest, GptDecodesAlikeInEveryLayout) {
  torch::manual_seed(4);
  gpt::GPT model(gpt::tiny_gpt_config());
  prepare(*model);
  expect_layouts_decode_alike(model.ptr(), model->config.n_positions);
}

TEST(CacheLayoutsTest, OptDecodesAlikeInEveryLayout) {
  OPTConfig c;
  c.vocab_size = 40, c.hidden_size = 16, c.num_hidden_layers = 2, c.ffn_dim = 32, c.num_attention_heads = 2;
  c.max_position_embeddings = 24, c.word_embed_proj_dim = 16, c.dropout = 0.0;
  torch::manual_seed(5);
  OPTForCausalLM model(c);
  prepare(*model);
  expect_layouts_decode_alike(model.ptr(), c.max_position_embeddings);
}

// Rotary positions, 4 query heads over 2 key-value heads, and a window of 3 keys: in a fixed-shape cache
// the window counts back from the slot being written, not from the buffer's end.
TEST(CacheLayoutsTest, SlidingWindowLlamaDecodesAlikeInEveryLayout) {
  LlamaConfig c;
  c.model_type = "mistral";
  c.vocab_size = 40, c.hidden_size = 16, c.intermediate_size = 32, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 4, c.max_position_embeddings = 16;
  c.rope.head_dim = c.head_dim, c.rope.max_positions = c.max_position_embeddings;
  c.sliding_window = 3;
  torch::manual_seed(6);
  LlamaForCausalLM model(c);
  prepare(*model);
  expect_layouts_decode_alike(model.ptr(), c.max_position_embeddings);
  // A window that did not count from the slot would change the logits: the same model without it differs.
  nn::SamplingOptions options;
  options.temperature = 0, options.max_new_tokens = 8;
  c.sliding_window = 0;
  torch::manual_seed(6);
  LlamaForCausalLM unwindowed(c);
  prepare(*unwindowed);
  EXPECT_GT((decode(unwindowed.ptr(), {{1, 2, 3, 4, 5}}, options, Cache::kFixedShape).logits.back() -
             decode(model.ptr(), {{1, 2, 3, 4, 5}}, options, Cache::kFixedShape).logits.back()).abs().max().item<double>(), 1e-3);
}

// A fixed-shape cache takes one token a step and never more than its slots; a reserved one never more
// than its slots either.
TEST(CacheLayoutsTest, ReservedCachesRefuseWhatDoesNotFit) {
  ops::KVCache cache;
  EXPECT_THROW(cache.reserve(4), Error);  // nothing appended yet: no shapes
  const torch::Tensor one = torch::ones({1, 2, 1, 3});
  cache.append(torch::cat({one, one}, 2), torch::cat({one, one}, 2));
  EXPECT_THROW(cache.reserve(1), Error);
  cache.reserve(3);
  cache.append(one * 2, one * 2);
  EXPECT_EQ(cache.length(), 3);
  EXPECT_EQ(cache.keys.select(2, 2).sum().item<double>(), 12.0);
  EXPECT_THROW(cache.append(one, one), Error);
  ops::KVCache fixed;
  fixed.append(one, one);
  fixed.reserve(3);
  fixed.fix_shape(torch::tensor({int64_t{2}}));
  EXPECT_THROW(fixed.append(torch::cat({one, one}, 2), torch::cat({one, one}, 2)), Error);
  fixed.append(one * 5, one * 5);
  EXPECT_EQ(fixed.keys.size(2), 3);
  EXPECT_EQ(fixed.keys.select(2, 2).sum().item<double>(), 30.0);
  EXPECT_EQ(fixed.keys.select(2, 1).sum().item<double>(), 0.0);  // an empty slot is zero, never NaN
}

}  // namespace
}  // namespace kuafu::opt

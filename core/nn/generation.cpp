#include "core/nn/generation.h"

#include <limits>

#include "core/util/error.h"

namespace kuafu::nn {

torch::Tensor filter_logits(torch::Tensor logits, int64_t top_k, double top_p) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (top_k > 0 && top_k < logits.size(0)) {
    const double kth = std::get<0>(torch::topk(logits, top_k)).index({top_k - 1}).item<double>();
    logits = logits.masked_fill(logits < kth, neg_inf);
  }
  if (top_p < 1.0) {
    auto [sorted, order] = torch::sort(logits, /*dim=*/0, /*descending=*/true);
    torch::Tensor cumulative = torch::softmax(sorted, 0).cumsum(0);
    // Drop a token when the tokens ranked above it already reach top_p (the top token always stays).
    torch::Tensor drop_sorted = (cumulative - torch::softmax(sorted, 0)) >= top_p;
    torch::Tensor drop = torch::zeros_like(drop_sorted).scatter(0, order, drop_sorted);
    logits = logits.masked_fill(drop, neg_inf);
  }
  return logits;
}

std::vector<int64_t> generate(const Decoder& decoder, const std::vector<int64_t>& prompt, const SamplingOptions& options) {
  KUAFU_CHECK(!prompt.empty(), "generate needs a prompt of at least one token");
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(options.seed);
  std::vector<ops::KVCache> caches;
  std::vector<int64_t> produced;
  const int64_t limit = decoder.context;
  KUAFU_CHECK(limit >= 2, "generate needs a model context of at least 2 positions");
  // The tokens the cache covers once `input` has run: the most recent prompt tokens that fit.
  std::vector<int64_t> window(prompt.end() - std::min<int64_t>(static_cast<int64_t>(prompt.size()), limit), prompt.end());
  const auto on_model = torch::TensorOptions(torch::kInt64).device(decoder.device);
  torch::Tensor input = torch::tensor(window, on_model).unsqueeze(0);
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    if (!caches.empty() && caches[0].length() + input.size(1) > limit) {
      // Context full: restart the cache from the last limit/2 tokens (rare in sampling demos).
      window.assign(window.end() - limit / 2, window.end());
      caches.clear();
      input = torch::tensor(window, on_model).unsqueeze(0);
    }
    // Sampled on the host with the seeded CPU generator: the same tokens on every device.
    torch::Tensor logits = decoder.forward(input, caches).index({0, -1}).to(torch::kCPU).to(torch::kFloat64);
    int64_t next;
    if (options.temperature <= 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      torch::Tensor filtered = filter_logits(logits / options.temperature, options.top_k, options.top_p);
      next = torch::multinomial(torch::softmax(filtered, 0), 1, false, generator).item<int64_t>();
    }
    produced.push_back(next);
    window.push_back(next);
    if (options.stop_token && next == *options.stop_token) break;
    input = torch::tensor({next}, on_model).unsqueeze(0);
  }
  return produced;
}

}  // namespace kuafu::nn

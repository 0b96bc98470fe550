#include "core/nn/generation.h"

#include <algorithm>
#include <limits>

#include "core/dist/collectives.h"
#include "core/nn/fixed_shape_decoding.h"
#include "core/util/error.h"

namespace kuafu::nn {

bool SamplingOptions::stops_at(int64_t token) const {
  return std::find(stop_tokens.begin(), stop_tokens.end(), token) != stop_tokens.end();
}

torch::Tensor filter_logits(torch::Tensor logits, int64_t top_k, double top_p) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (top_k > 0 && top_k < logits.size(-1)) {
    const torch::Tensor kth = std::get<0>(torch::topk(logits, top_k, -1)).narrow(-1, top_k - 1, 1);  // [..., 1]
    logits = logits.masked_fill(logits < kth, neg_inf);
  }
  if (top_p < 1.0) {
    auto [sorted, order] = torch::sort(logits, /*dim=*/-1, /*descending=*/true);
    const torch::Tensor probs = torch::softmax(sorted, -1);
    // Drop a token when the tokens ranked above it already reach top_p (the top token always stays).
    const torch::Tensor drop_sorted = (probs.cumsum(-1) - probs) >= top_p;
    const torch::Tensor drop = torch::zeros_like(drop_sorted).scatter(-1, order, drop_sorted);
    logits = logits.masked_fill(drop, neg_inf);
  }
  return logits;
}

torch::Tensor sample_rows(const torch::Tensor& logits, at::Generator& generator) {
  const int64_t vocab = logits.size(1);
  const torch::Tensor weights = (logits - std::get<0>(logits.max(1, /*keepdim=*/true))).exp();  // [B, V]; −inf: 0
  const torch::Tensor cdf = weights.cumsum(1);                                                   // [B, V]
  const torch::Tensor u = torch::rand({logits.size(0), 1}, generator, logits.options()) * cdf.narrow(1, vocab - 1, 1);  // [B, 1]
  // The first token whose cumulative weight passes u: token i when cdf[i − 1] <= u < cdf[i], so a token
  // of weight 0 never is.
  return torch::searchsorted(cdf, u, /*out_int32=*/false, /*right=*/true).clamp_max(vocab - 1).squeeze(1);
}

DecodeStep whole_rows_step(const torch::Tensor& tokens, const torch::Tensor& real) {
  const torch::Tensor mask = real.to(torch::kBool);
  return {tokens, (mask.to(torch::kInt64).cumsum(1) - 1).clamp_min(0), mask};
}

namespace {

// The rows' windows left-padded into one first decoding step; its key_padding (which keys are real
// tokens) is set only when some row is padded.
DecodeStep left_padded(const std::vector<std::vector<int64_t>>& windows, const torch::Device& device) {
  const int64_t rows = static_cast<int64_t>(windows.size());
  int64_t longest = 0;
  for (const auto& w : windows) longest = std::max<int64_t>(longest, static_cast<int64_t>(w.size()));
  torch::Tensor tokens = torch::zeros({rows, longest}, torch::kInt64);  // padding's id is never attended to
  torch::Tensor real = torch::zeros({rows, longest}, torch::kBool);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& w = windows[static_cast<size_t>(r)];
    const int64_t pad = longest - static_cast<int64_t>(w.size());
    tokens[r].narrow(0, pad, static_cast<int64_t>(w.size())).copy_(torch::tensor(w, torch::kInt64));
    real[r].narrow(0, pad, static_cast<int64_t>(w.size())).fill_(true);
  }
  DecodeStep step = whole_rows_step(tokens.to(device), real.to(device));
  if (step.key_padding.all().item<bool>()) step.key_padding = torch::Tensor();  // set only when some row is padded
  return step;
}

// kAuto resolved: graphs (kAuto) where they can run, else reserved buffers.
SamplingOptions::Cache cache_layout(const Decoder& decoder, const SamplingOptions& options) {
  if (options.cache != SamplingOptions::Cache::kAuto) return options.cache;
  return options.cuda_graphs && decoder.capturable && decoder.device.is_cuda() ? SamplingOptions::Cache::kAuto
                                                                               : SamplingOptions::Cache::kReserved;
}

}  // namespace

std::vector<std::vector<int64_t>> generate(const Decoder& decoder, const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& options) {
  KUAFU_CHECK(!prompts.empty(), "generate needs at least one prompt");
  for (size_t r = 0; r < prompts.size(); ++r) {
    KUAFU_CHECK(!prompts[r].empty(), "generate needs prompts of at least one token; prompt ", r, " is empty");
  }
  const int64_t limit = decoder.context;
  KUAFU_CHECK(limit >= 2, "generate needs a model context of at least 2 positions");
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(options.seed);
  const size_t rows = prompts.size();
  // Each row's real tokens that the cache covers once the step has run: the most recent that fit.
  std::vector<std::vector<int64_t>> windows;
  for (const auto& prompt : prompts) {
    windows.emplace_back(prompt.end() - std::min<int64_t>(static_cast<int64_t>(prompt.size()), limit), prompt.end());
  }
  std::vector<std::vector<int64_t>> produced(rows);
  std::vector<bool> stopped(rows, false);
  std::vector<ops::KVCache> caches;
  std::unique_ptr<FixedShapeSteps> fixed;  // the steps after the first when the caches have fixed shapes
  int64_t cached = 0;  // tokens in each cache
  auto first_step = [&] {
    caches.clear();
    fixed.reset();
    cached = 0;
    return left_padded(windows, decoder.device);
  };
  const SamplingOptions::Cache layout = cache_layout(decoder, options);
  DecodeStep step = first_step();
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    if (options.interrupted && options.interrupted()) break;
    if (cached > 0 && cached + 1 > limit) {
      // Context full: restart every row's cache from its last limit/2 tokens (rare in sampling demos).
      for (auto& w : windows) w.assign(w.end() - std::min<int64_t>(static_cast<int64_t>(w.size()), limit / 2), w.end());
      step = first_step();
    }
    torch::Tensor logits;  // [B, T, V]
    if (fixed) {
      logits = fixed->run(step);
    } else {
      const bool first = caches.empty();
      logits = decoder.forward(step, caches);
      if (first && layout != SamplingOptions::Cache::kGrowing) {
        // Room for every token this call can add beside the longest window, up to the context (where it restarts).
        const int64_t longest = step.tokens.size(1);
        const int64_t capacity = std::min<int64_t>(limit, longest + options.max_new_tokens - 1);
        if (capacity > longest) {
          for (auto& cache : caches) cache.reserve(capacity);
          if (layout != SamplingOptions::Cache::kReserved) {
            fixed = std::make_unique<FixedShapeSteps>(decoder, caches, step, layout == SamplingOptions::Cache::kAuto);
          }
        }
      }
    }
    cached += step.tokens.size(1);
    logits = logits.select(1, -1);  // [B, V]
    if (options.vocab_limit > 0 && options.vocab_limit < logits.size(1)) logits = logits.narrow(1, 0, options.vocab_limit);
    // Every row at once. Greedy picks on the device (widening to float64 changes no order); sampling
    // runs on the host with the seeded CPU generator in float64, so the tokens are the same on every
    // device.
    torch::Tensor chosen;  // [B] on the host
    if (options.temperature <= 0) {
      chosen = logits.argmax(1).to(torch::kCPU);
    } else {
      const torch::Tensor scaled = logits.to(torch::kCPU).to(torch::kFloat64) / options.temperature;
      chosen = sample_rows(filter_logits(scaled, options.top_k, options.top_p), generator);
    }
    chosen = chosen.contiguous();
    const std::vector<int64_t> next(chosen.data_ptr<int64_t>(), chosen.data_ptr<int64_t>() + rows);
    for (size_t r = 0; r < rows; ++r) {
      windows[r].push_back(next[r]);
      if (stopped[r]) continue;  // a stopped row still decodes with the batch; its tokens are dropped
      produced[r].push_back(next[r]);
      if (options.on_token) options.on_token(r, next[r]);
      if (options.stops_at(next[r])) stopped[r] = true;
    }
    const bool done_here = std::all_of(stopped.begin(), stopped.end(), [](bool s) { return s; });
    if (decoder.all_done ? decoder.all_done(done_here) : done_here) break;
    std::vector<int64_t> positions;
    for (const auto& w : windows) positions.push_back(static_cast<int64_t>(w.size()) - 1);
    const auto on_model = torch::TensorOptions(torch::kInt64).device(decoder.device);
    step.tokens = torch::tensor(next, on_model).unsqueeze(1);
    step.positions = torch::tensor(positions, on_model).unsqueeze(1);
    if (step.key_padding.defined() && !fixed) {  // the new token is real in every row
      step.key_padding = torch::cat({step.key_padding, torch::ones({step.key_padding.size(0), 1}, step.key_padding.options())}, 1);
    }
  }
  return produced;
}

std::function<bool(bool)> all_done_over(dist::GroupPtr group) {
  return [group = std::move(group)](bool done_here) {
    torch::Tensor flag = torch::tensor({done_here ? 1.0 : 0.0}, torch::TensorOptions(torch::kFloat64).device(group->device()));
    dist::all_reduce(flag, *group, dist::Reduce::kMin);
    return flag.item<double>() > 0;
  };
}

std::vector<int64_t> generate(const Decoder& decoder, const std::vector<int64_t>& prompt, const SamplingOptions& options) {
  return generate(decoder, std::vector<std::vector<int64_t>>{prompt}, options)[0];
}

}  // namespace kuafu::nn

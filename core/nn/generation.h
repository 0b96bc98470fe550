// Sampling from a causal language model that decodes with a key-value cache: a batch of prompts of any
// lengths, left-padded into one batch, each row at its own positions; greedy or with temperature, top-k
// and nucleus (top-p) filtering, drawn from a seeded host generator (the same tokens on every device);
// a row stops at any of its stop tokens; when the context fills, decoding restarts from the last half of it.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "core/dist/process_group.h"
#include "core/ops/attention.h"

namespace kuafu::nn {

struct SamplingOptions {
  int64_t max_new_tokens = 200;
  double temperature = 1.0;  // 0 = greedy
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  uint64_t seed = 0;
  std::vector<int64_t> stop_tokens;  // a row stops once it produces any of these (kept as its last token)
  bool stops_at(int64_t token) const;
  // Only ids below this are ever chosen (0: every row of the output layer). OPT's embedding has 50,272
  // rows for a 50,265-token tokenizer: the extra rows are padding, never sampled, never resized away.
  int64_t vocab_limit = 0;
  // Streaming: called with each row's new token as it is chosen (a stopped row's later tokens are not).
  std::function<void(size_t row, int64_t token)> on_token;
  // Checked before each decoding step: true stops every row where it is (Ctrl-C), and what each row
  // produced so far is returned. Single-process use: ranks decoding together must all stop.
  std::function<bool()> interrupted;
  // How the caches hold the tokens after the first (prompt) step.
  enum class Cache {
    kAuto,        // fixed shapes replayed as CUDA graphs where the decoder allows it and cuda_graphs is on, else reserved
    kGrowing,     // concatenated each step (every step copies the whole cache)
    kReserved,    // buffers for every token the call can hold, written in place
    kFixedShape,  // reserved, read whole with the empty slots masked, never captured (what a graph replays)
  };
  Cache cache = Cache::kAuto;
  bool cuda_graphs = true;  // generate.cuda_graphs: kAuto may capture the decoding step on a CUDA device
};

// One decoding call: the new tokens of every row, where each one sits in its row's sequence, and which
// keys (the cached ones, then the new ones) are real tokens rather than left padding.
struct DecodeStep {
  torch::Tensor tokens;     // [B, T]
  torch::Tensor positions;  // [B, T]: the count of the row's real tokens before each (models add their own
                            // offset, e.g. OPT's 2); padding's own positions are 0 and never seen
  torch::Tensor key_padding;  // [B, cached + T], true: a real token; undefined when no row is padded
};

// Whole rows of tokens [B, T] with padding anywhere (real [B, T] true on real tokens: left-padded
// prompts, right-padded responses) as one step from an empty cache: each real token at the count of real
// tokens before it, padding masked out of every key. A row's real tokens get the same outputs wherever
// its padding is.
DecodeStep whole_rows_step(const torch::Tensor& tokens, const torch::Tensor& real);

// A causal language model as generation sees it.
struct Decoder {
  // Logits [B, T, V] of `step`'s tokens continuing the sequences `caches` hold (empty: new ones; one
  // cache per layer, appended to as it runs).
  std::function<torch::Tensor(const DecodeStep& step, std::vector<ops::KVCache>& caches)> forward;
  int64_t context = 0;  // positions the model covers
  torch::Device device = torch::kCPU;
  // Whether every rank that decodes together has finished, given whether this rank has (a collective):
  // under a layout whose forward communicates (Gemini gathering chunks over the data ranks) a rank
  // whose rows have all stopped keeps decoding, one forward per step, until all have. Null: this rank's.
  std::function<bool(bool done_here)> all_done;
  // Whether a decoding step may be captured as a CUDA graph: forward runs tensor operations only (no
  // collectives, no hooks moving weights, no host reads of a tensor's value).
  bool capturable = false;
};

// all_done for the ranks of `group`: one all-reduce of a flag per decoding step.
std::function<bool(bool)> all_done_over(dist::GroupPtr group);

// Continues every prompt (token ids) in one batch; returns each row's new tokens. The model should be
// in eval mode. Row r's tokens equal those of generating from prompts[r] alone when greedy; sampling
// draws from one seeded generator (sample_rows), so the same batch gives the same tokens.
std::vector<std::vector<int64_t>> generate(const Decoder& decoder, const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& options);
std::vector<int64_t> generate(const Decoder& decoder, const std::vector<int64_t>& prompt, const SamplingOptions& options);

// One token per row of `logits` [B, V] (float64 on the host; −inf: never chosen), drawn with probability
// softmax(logits) by inverting each row's cumulative distribution at one uniform from `generator`:
// torch::multinomial took 114 ms for 64 rows of 50,272 tokens on this machine, this 12. Returns [B] ids.
torch::Tensor sample_rows(const torch::Tensor& logits, at::Generator& generator);

// Keeps the logits a sampler may choose from (top-k, then nucleus top-p) along the last dimension;
// others become -inf.
torch::Tensor filter_logits(torch::Tensor logits, int64_t top_k, double top_p);  // logits [..., V]

}  // namespace kuafu::nn

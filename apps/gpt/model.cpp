#include "apps/gpt/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "core/parallel/pipeline/partition.h"
#include "core/util/device.h"
#include "core/util/error.h"

namespace kuafu::gpt {

int64_t GPTConfig::parameter_count() const {
  const int64_t c = n_embd;
  const int64_t per_block = 2 * 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * 4 * c + 4 * c) + (4 * c * c + c);
  return vocab_size * c + n_positions * c + n_layer * per_block + 2 * c;
}

double GPTConfig::flops_per_token(int64_t t) const {
  return 6.0 * static_cast<double>(parameter_count()) + 12.0 * static_cast<double>(n_layer * n_embd * t);
}

namespace {

parallel::LinearSpec conv1d(int64_t in, int64_t out, int64_t stride = 1) {
  return parallel::LinearSpec{in, out, /*bias=*/true, parallel::WeightOrder::kInOut, stride};
}

}  // namespace

AttentionImpl::AttentionImpl(const GPTConfig& config, const parallel::TensorParallel& tp)
    : n_head(config.n_head / tp.feature_blocks()), dropout(config.dropout) {
  KUAFU_CHECK(config.n_embd % config.n_head == 0, "model.n_embd (", config.n_embd, ") must divide by model.n_head (",
              config.n_head, ")");
  KUAFU_CHECK(config.n_head % tp.feature_blocks() == 0, "model.n_head (", config.n_head, ") must divide by the ",
              tp.feature_blocks(), " blocks parallel.tensor.mode = \"", parallel::mode_name(tp.spec.mode),
              "\" cuts the heads into");
  c_attn = parallel::make_linear(tp, conv1d(config.n_embd, 3 * config.n_embd, /*stride=*/3), parallel::Cut::kColumn);
  c_proj = parallel::make_linear(tp, conv1d(config.n_embd, config.n_embd), parallel::Cut::kRow);
  register_module("c_attn", c_attn.ptr());
  register_module("c_proj", c_proj.ptr());
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, nn::KVCache* cache) {
  torch::Tensor fused = c_attn.forward(x);  // [B, T, 3 c]: this rank's heads of q|k|v
  const int64_t b = x.size(0), t = x.size(1), c = fused.size(2) / 3;
  auto heads = [&](const torch::Tensor& y) { return y.view({b, t, n_head, c / n_head}).transpose(1, 2); };
  auto qkv = fused.split(c, /*dim=*/2);
  torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);  // [B, H, T, D]
  if (cache) std::tie(k, v) = cache->append(k, v);
  const bool causal = !(cache && t == 1);  // one new token may attend to everything cached
  torch::Tensor y = parallel::sequence::attention(q, k, v, causal, is_training() ? dropout : 0.0, sequence);
  y = y.transpose(1, 2).contiguous().view({b, t, c});
  return resid_dropout(c_proj.forward(y));
}

MLPImpl::MLPImpl(const GPTConfig& config, const parallel::TensorParallel& tp) {
  c_fc = parallel::make_linear(tp, conv1d(config.n_embd, 4 * config.n_embd), parallel::Cut::kColumn);
  c_proj = parallel::make_linear(tp, conv1d(4 * config.n_embd, config.n_embd), parallel::Cut::kRow);
  register_module("c_fc", c_fc.ptr());
  register_module("c_proj", c_proj.ptr());
  dropout = register_module("dropout", torch::nn::Dropout(config.dropout));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return dropout(c_proj.forward(torch::gelu(c_fc.forward(x), "tanh")));  // GPT-2's "gelu_new"
}

BlockImpl::BlockImpl(const GPTConfig& config, const parallel::TensorParallel& tp) {
  ln_1 = parallel::make_layer_norm(tp, config.n_embd, config.layer_norm_epsilon);
  register_module("ln_1", ln_1.ptr());
  attn = register_module("attn", Attention(config, tp));
  ln_2 = parallel::make_layer_norm(tp, config.n_embd, config.layer_norm_epsilon);
  register_module("ln_2", ln_2.ptr());
  mlp = register_module("mlp", MLP(config, tp));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, nn::KVCache* cache) {
  torch::Tensor h = x + attn(ln_1.forward(x), cache);
  return h + mlp(ln_2.forward(h));
}

TransformerImpl::TransformerImpl(const GPTConfig& config, const parallel::TensorParallel& tp) {
  wte = register_module("wte", parallel::make_embedding(tp, config.vocab_size, config.n_embd));
  wpe = parallel::make_position_embedding(tp, config.n_positions, config.n_embd);
  register_module("wpe", wpe.ptr());
  drop = register_module("drop", torch::nn::Dropout(config.dropout));
  h = register_module("h", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < config.n_layer; ++i) blocks.push_back(h->register_module(std::to_string(i), Block(config, tp)));
  ln_f = parallel::make_layer_norm(tp, config.n_embd, config.layer_norm_epsilon);
  register_module("ln_f", ln_f.ptr());
}

namespace {

StagePlan plan_from_bounds(const parallel::pipeline::ScheduleSpec& spec, int stage, const std::vector<int>& bounds) {
  StagePlan plan;
  for (int c = 0; c < spec.chunks; ++c) {
    const int v = c * spec.stages + stage;
    plan.chunks.emplace_back(bounds[v], bounds[v + 1]);
  }
  plan.first = stage == 0;
  plan.last = stage == spec.stages - 1;
  return plan;
}

}  // namespace

StagePlan pipeline_stage_plan(const parallel::pipeline::ScheduleSpec& spec, int stage, int64_t layers) {
  return plan_from_bounds(spec, stage, parallel::pipeline::partition_uniform(static_cast<int>(layers), spec.virtual_stages()));
}

StagePlan pipeline_stage_plan(const parallel::pipeline::ScheduleSpec& spec, int stage, int64_t layers,
                              const StageCosts& costs) {
  const std::vector<double> per_layer(static_cast<size_t>(layers), costs.layer);
  return plan_from_bounds(spec, stage,
                          parallel::pipeline::partition_balanced(per_layer, spec.virtual_stages(), costs.first, costs.last));
}

StageCosts parameter_costs(const GPTConfig& config) {
  GPTConfig one_layer = config;
  one_layer.n_layer = 1;
  const double embeddings = static_cast<double>(config.vocab_size * config.n_embd);
  const double positions = static_cast<double>(config.n_positions * config.n_embd);
  const double norm = 2.0 * static_cast<double>(config.n_embd);  // ln_f
  return {static_cast<double>(one_layer.parameter_count()) - embeddings - positions - norm, embeddings + positions,
          embeddings + norm};
}

StageCosts measured_costs(const GPTConfig& config, int64_t rows, int64_t context, const torch::Device& device) {
  GPTConfig one_layer = config;
  one_layer.n_layer = 1;
  parallel::TensorParallel serial;
  serial.device = device;
  GPT model(one_layer, serial);
  const torch::Tensor tokens = torch::randint(config.vocab_size, {rows, context}, torch::TensorOptions(torch::kInt64).device(device));
  auto median_seconds = [&](const std::function<void()>& work) {
    work();  // warm-up
    std::vector<double> times;
    for (int i = 0; i < 3; ++i) {
      synchronize(device);
      const auto start = std::chrono::steady_clock::now();
      work();
      synchronize(device);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    return times[1];
  };
  const torch::Tensor hidden = model->embed(tokens).detach();
  StageCosts costs;
  costs.first = median_seconds([&] { model->embed(tokens).sum().backward(); });
  costs.layer = median_seconds([&] {
    model->run_blocks(hidden.clone().requires_grad_(), 0, 1).sum().backward();
  });
  costs.last = median_seconds([&] {
    model->stage_loss(hidden.clone().requires_grad_(), tokens).backward();
  });
  return costs;
}

GPTImpl::GPTImpl(const GPTConfig& cfg, parallel::TensorParallel tensor_parallel, std::optional<StagePlan> stage_plan,
                 parallel::sequence::SequenceParallel sequence_parallel)
    : config(cfg),
      tp(std::move(tensor_parallel)),
      plan(stage_plan.value_or(StagePlan::whole(cfg.n_layer))),
      sequence(std::move(sequence_parallel)) {
  for (const auto& [begin, end] : plan.chunks) {
    KUAFU_CHECK(0 <= begin && begin < end && end <= cfg.n_layer, "pipeline stage plan: layers [", begin, ", ", end,
                ") are not a non-empty range of the model's ", cfg.n_layer, " layers");
  }
  KUAFU_CHECK(!sequence.enabled() || (!tp.enabled() && plan.chunks.size() == 1 && plan.first && plan.last),
              "sequence parallelism combines with data parallelism only (no tensor or pipeline parallelism)");
  transformer = register_module("transformer", Transformer(cfg, tp));
  for (auto& block : transformer->blocks) block->attn->sequence = sequence;
  initialize();
  keep_only_planned_parts();
}

void GPTImpl::keep_only_planned_parts() {
  // Every rank builds and initialises the whole model (so each part equals the serial one from the
  // seed), then drops what other pipeline stages hold.
  std::vector<bool> held(static_cast<size_t>(config.n_layer), false);
  for (const auto& [begin, end] : plan.chunks) {
    for (int64_t i = begin; i < end; ++i) held[static_cast<size_t>(i)] = true;
  }
  for (int64_t i = 0; i < config.n_layer; ++i) {
    if (held[static_cast<size_t>(i)]) continue;
    transformer->h->unregister_module(std::to_string(i));
    transformer->blocks[static_cast<size_t>(i)] = nullptr;
  }
  if (!plan.first && !plan.last) {
    transformer->unregister_module("wte");
    transformer->wte = nullptr;
  }
  if (!plan.first) {
    transformer->unregister_module("wpe");
    transformer->wpe = torch::nn::AnyModule();
  }
  if (!plan.last) {
    transformer->unregister_module("ln_f");
    transformer->ln_f = torch::nn::AnyModule();
  }
}

void GPTImpl::initialize() {
  // GPT-2 initialisation: N(0, 0.02) weights, zero biases, and residual projections scaled by
  // 1/sqrt(2 * n_layer) so the residual stream's variance does not grow with depth.
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  parallel::initialize_like_serial(*this, tp, [&](const std::string& name, torch::Tensor& full) {
    if (name.find("ln_") != std::string::npos) return false;  // LayerNorm keeps ones / zeros
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      full.zero_();
    } else {
      full.normal_(0.0, name.find("c_proj.weight") != std::string::npos ? residual_std : 0.02);
    }
    return true;
  });
}

torch::Tensor GPTImpl::embed(const torch::Tensor& tokens, int64_t past) {
  KUAFU_CHECK(!transformer->wpe.is_empty(), "this pipeline stage does not hold the embeddings");
  const int64_t t = tokens.size(1);
  KUAFU_CHECK(past + t <= config.n_positions, "sequence of ", past + t, " tokens exceeds model.n_positions = ",
              config.n_positions);
  torch::Tensor positions = torch::arange(past, past + t, tokens.options().dtype(torch::kInt64));
  // [B, T] ids -> this rank's block of the stream; the position embedding [T, C] broadcasts over rows.
  const nn::BlockCall call{"transformer.embed", {transformer->wte.get(), transformer->wpe.ptr().get()}};
  return nn::run_block(block_hooks, call, tokens, [&](const torch::Tensor& ids) {
    return transformer->drop(transformer->wte->forward(ids) + transformer->wpe.forward(positions));
  });
}

torch::Tensor GPTImpl::run_blocks(torch::Tensor x, int64_t begin, int64_t end, std::vector<nn::KVCache>* caches) {
  for (int64_t i = begin; i < end; ++i) {
    Block& block = transformer->blocks[static_cast<size_t>(i)];
    KUAFU_CHECK(block, "this pipeline stage does not hold layer ", i);
    nn::KVCache* cache = caches ? &(*caches)[static_cast<size_t>(i)] : nullptr;
    x = nn::run_block(block_hooks, {"transformer.h." + std::to_string(i), {block.get()}}, x,
                      [&](const torch::Tensor& input) { return block->forward(input, cache); });
  }
  return x;
}

torch::Tensor GPTImpl::local_logits(const torch::Tensor& x) {
  KUAFU_CHECK(!transformer->ln_f.is_empty(), "this pipeline stage does not hold the output layer");
  return transformer->wte->logits(transformer->ln_f.forward(x));  // the tied output layer
}

nn::BlockCall GPTImpl::head_call() const {
  return {"transformer.head", {transformer->ln_f.ptr().get(), transformer->wte.get()}};
}

torch::Tensor GPTImpl::stage_loss(const torch::Tensor& x, const torch::Tensor& targets) {
  return nn::run_block(block_hooks, head_call(), x, [&](const torch::Tensor& stream) {
    // The softmax runs in float32 whatever the compute dtype: bf16 logits would round the loss itself.
    torch::Tensor logits = local_logits(stream);
    return transformer->wte->cross_entropy(logits.to(at::promote_types(logits.scalar_type(), torch::kFloat32)),
                                           targets);
  });
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens, std::vector<nn::KVCache>* caches) {
  if (sequence.enabled()) {
    KUAFU_CHECK(!caches, "incremental decoding runs without sequence parallelism");
    const torch::Tensor chunk = parallel::sequence::local_chunk(tokens, 1, sequence);
    const torch::Tensor x = run_blocks(embed(chunk, sequence.rank() * chunk.size(1)), 0, config.n_layer);
    return parallel::sequence::gather_chunks(transformer->wte->gather_logits(local_logits(x)), 1, sequence);
  }
  const int64_t past = caches && !caches->empty() ? (*caches)[0].length() : 0;
  if (caches && caches->empty()) caches->resize(static_cast<size_t>(config.n_layer));
  const torch::Tensor x = run_blocks(embed(tokens, past), 0, config.n_layer, caches);
  return nn::run_block(block_hooks, head_call(), x, [&](const torch::Tensor& stream) {
    return transformer->wte->gather_logits(local_logits(stream));
  });
}

torch::Tensor GPTImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  if (sequence.enabled()) {
    // This rank's positions [r C, (r + 1) C) of every row: the position embedding starts at r C.
    const torch::Tensor chunk = parallel::sequence::local_chunk(tokens, 1, sequence);
    const torch::Tensor x = run_blocks(embed(chunk, sequence.rank() * chunk.size(1)), 0, config.n_layer);
    return stage_loss(x, parallel::sequence::local_chunk(targets, 1, sequence));
  }
  return stage_loss(run_blocks(embed(tokens), 0, config.n_layer), targets);
}

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

std::vector<int64_t> generate(GPT& model, const std::vector<int64_t>& prompt, const SamplingOptions& options) {
  KUAFU_CHECK(!prompt.empty(), "generate needs a prompt of at least one token");
  torch::NoGradGuard no_grad;
  model->eval();
  auto generator = at::detail::createCPUGenerator(options.seed);
  std::vector<nn::KVCache> caches;
  std::vector<int64_t> produced;
  const int64_t limit = model->config.n_positions;
  // Keep the most recent tokens that fit the context, with room for what we will generate.
  std::vector<int64_t> context(prompt.end() - std::min<int64_t>(static_cast<int64_t>(prompt.size()), limit), prompt.end());
  const auto on_model = torch::TensorOptions(torch::kInt64).device(model->parameters().front().device());
  torch::Tensor input = torch::tensor(context, on_model).unsqueeze(0);
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    if (!caches.empty() && caches[0].length() + input.size(1) > limit) {
      // Context full: restart the cache from the last limit/2 tokens (rare in sampling demos).
      std::vector<int64_t> all = context;
      all.insert(all.end(), produced.begin(), produced.end());
      context.assign(all.end() - limit / 2, all.end());
      produced.clear();
      caches.clear();
      input = torch::tensor(context, on_model).unsqueeze(0);
    }
    // Sampled on the host with the seeded CPU generator: the same tokens on every device.
    torch::Tensor logits = model->forward(input, &caches).index({0, -1}).to(torch::kCPU).to(torch::kFloat64);
    int64_t next;
    if (options.temperature <= 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      torch::Tensor filtered = filter_logits(logits / options.temperature, options.top_k, options.top_p);
      next = torch::multinomial(torch::softmax(filtered, 0), 1, false, generator).item<int64_t>();
    }
    produced.push_back(next);
    if (options.stop_token && next == *options.stop_token) break;
    input = torch::tensor({next}, on_model).unsqueeze(0);
  }
  return produced;
}

}  // namespace kuafu::gpt

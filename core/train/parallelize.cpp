#include "core/train/parallelize.h"

#include <algorithm>
#include <functional>
#include <map>

#include "core/dist/collectives.h"
#include "core/memory/activation_checkpoint.h"
#include "core/nn/transformer_block.h"
#include "core/util/device.h"
#include "core/train/lazy_model.h"
#include "core/util/error.h"
#include "core/util/logging.h"
#include "core/util/text.h"

namespace kuafu::train {

namespace pp = parallel::pipeline;
namespace sp = parallel::sequence;

namespace {

using ModuleMap = std::map<std::string, std::shared_ptr<torch::nn::Module>>;

ModuleMap modules_by_path(torch::nn::Module& root) {
  ModuleMap found;
  for (const auto& item : root.named_modules()) found[item.key()] = item.value();
  return found;
}

// The model as one stream: sequence parallelism cuts it, pipeline stages send it and the partition times
// it (kuafu::Error naming `what` for a model of several streams).
hooks::OneStreamModel& one_stream(hooks::BlockModel& model, const std::string& what) {
  auto* one = dynamic_cast<hooks::OneStreamModel*>(&model);
  KUAFU_CHECK(one, what, " a model's one stream, but this model carries several (its blocks map a list of streams)");
  return *one;
}

}  // namespace

ParallelModel::ParallelModel(hooks::BlockModel& model, ParallelOptions options)
    : model_(model), options_(std::move(options)) {
  const int64_t n = model_.num_blocks();
  if (options_.plan.chunks.empty()) options_.plan = pp::StagePlan::whole(n);
  for (const auto& [begin, end] : options_.plan.chunks) {
    KUAFU_CHECK(0 <= begin && begin < end && end <= n, "pipeline stage plan: blocks [", begin, ", ", end,
                ") are not a non-empty range of the model's ", n, " blocks");
  }
  KUAFU_CHECK(!options_.sequence.enabled() || !pipelined(),
              "sequence parallelism combines with data parallelism only (no pipeline parallelism)");
  if (options_.sequence.enabled()) one_stream(model_, "sequence parallelism cuts");
  if (pipelined()) one_stream(model_, "pipeline stages send");
  // 2. Sequence parallelism: attention learns its group; the runner cuts the stream.
  for (const auto& module : model_.module().modules()) {
    if (auto* core = dynamic_cast<nn::AttentionCoreImpl*>(module.get())) core->sequence = options_.sequence;
  }
  {
    const ModuleMap modules = modules_by_path(model_.module());
    for (const auto& head_path : model_.head_part().modules) {
      const auto& tail_paths = model_.tail_part().modules;
      if (std::find(tail_paths.begin(), tail_paths.end(), head_path) == tail_paths.end()) continue;
      for (const auto& item : modules.at(head_path)->named_parameters()) tied_.insert(head_path + "." + item.key());
    }
  }
  // 3. Pipeline staging.
  if (pipelined()) {
    KUAFU_CHECK(options_.pipeline && options_.pipeline->size() == options_.schedule.stages,
                "a pipeline of ", options_.schedule.stages, " stages needs its group");
    keep_planned_parts();
    train_engine_ = std::make_unique<pp::PipelineEngine>(options_.schedule, options_.pipeline);
    pp::ScheduleSpec one = options_.schedule;  // evaluation runs one micro-batch at a time
    one.micro_batches = 1;
    eval_engine_ = std::make_unique<pp::PipelineEngine>(one, options_.pipeline);
  }
  // The parts this rank holds become the model's block sites, for steps 4 and 5.
  std::vector<std::string> held_blocks;
  for (int64_t i = 0; i < n; ++i) {
    if (options_.plan.holds_block(i)) held_blocks.push_back(model_.block_part(i).name);
  }
  model_.use_parts(options_.plan.first, options_.plan.last, [this](int64_t i) { return options_.plan.holds_block(i); });
  hooks::BlockSites& sites = model_.block_sites();
  // 4. Activation checkpointing: every block this rank holds, or those the patterns name.
  if (options_.checkpoint_activations) {
    memory::checkpoint_blocks(sites, options_.checkpoint_blocks.empty() ? held_blocks : options_.checkpoint_blocks);
  }
}

StageParts stage_parts(hooks::BlockModel& model, const pp::StagePlan& plan) {
  const bool whole = plan.chunks.empty();
  StageParts parts;
  auto note = [&](const hooks::ModelPart& part, bool keep) {
    for (const auto& path : part.modules) {
      parts.all.insert(path);
      if (keep || whole) parts.held.insert(path);
    }
  };
  note(model.head_part(), plan.first);
  note(model.tail_part(), plan.last);
  for (int64_t i = 0; i < model.num_blocks(); ++i) note(model.block_part(i), plan.holds_block(i));
  return parts;
}

bool StageParts::holds(const std::string& name) const {
  bool in_a_part = false;
  for (const auto& path : all) {
    if (!text::starts_with(name, path + ".")) continue;
    if (held.count(path)) return true;
    in_a_part = true;
  }
  return !in_a_part;
}

void ParallelModel::keep_planned_parts() {
  // Every rank described the whole model and initialised it as the serial one from the seed (drawing
  // for the parts it does not hold: train::materialize leaves those on the meta device); the parts of
  // other stages leave the module tree, giving back whatever memory they held.
  const auto [held, all] = stage_parts(model_, options_.plan);
  const ModuleMap modules = modules_by_path(model_.module());
  for (const auto& path : all) {
    if (held.count(path)) continue;
    torch::NoGradGuard no_grad;
    for (auto& p : modules.at(path)->parameters()) p.set_data(torch::empty({0}, p.options()));
    const size_t dot = path.rfind('.');
    const std::string parent = dot == std::string::npos ? "" : path.substr(0, dot);
    modules.at(parent)->unregister_module(dot == std::string::npos ? path : path.substr(dot + 1));
  }
  std::set<std::string> kept_tied;
  for (const auto& name : tied_) {
    if (model_.module().named_parameters().contains(name)) kept_tied.insert(name);
  }
  tied_ = kept_tied;
}

torch::Tensor ParallelModel::run_unstaged(const Batch& whole, bool sums) {
  const sp::SequenceParallel& sequence = options_.sequence;
  const int64_t n = model_.num_blocks();
  hooks::Tensors recycled = model_.recycle(whole);
  const Batch batch = model_.iteration_batch(whole, model_.iterations(whole) - 1);
  if (!sequence.enabled()) return model_.call_tail(model_.call_head_and_blocks(batch, std::move(recycled)), batch, sums);
  const hooks::Tensors streams = model_.call_head(batch, recycled);
  recycled.clear();  // embedded: the blocks may use its memory
  // Sequence parallelism: each rank's blocks run on its chunk of the positions (the batch, whole, gives
  // them their context).
  hooks::OneStreamModel& model = one_stream(model_, "sequence parallelism cuts");
  const torch::Tensor x = model_.call_blocks({sp::local_chunk(streams.at(0), 1, sequence)}, 0, n, batch).at(0);
  if (model.tail_per_position()) {
    Batch chunk = batch;
    chunk.targets = sp::local_chunk(batch.targets, 1, sequence);
    const torch::Tensor out = model_.call_tail({x}, chunk, sums);
    if (sums) return out;
    // This rank's mean over its items, weighted by their share of the row's (x P: the gradients are
    // averaged over the sequence ranks). 1 exactly when every position counts.
    const torch::Tensor share = model.tail_items(chunk.targets) * static_cast<double>(sequence.size) /
                                model.tail_items(batch.targets).clamp_min(1.0);
    return out * share.to(out.scalar_type());
  }
  return model_.call_tail({sp::gather_chunks(x, 1, sequence)}, batch, sums);
}

torch::Tensor ParallelModel::loss(const Batch& batch) {
  KUAFU_CHECK(!pipelined(), "a pipelined model trains through pipeline_step");
  return run_unstaged(batch, /*sums=*/false);
}

torch::Tensor ParallelModel::stage_forward(int chunk, const torch::Tensor& input, const Batch& micro_batch, bool sums) {
  const pp::ScheduleSpec& spec = options_.schedule;
  KUAFU_CHECK(model_.iterations(micro_batch) == 1, "a pipelined model runs each micro-batch once (no recycling)");
  const int v = chunk * spec.stages + options_.pipeline->rank();
  const auto [begin, end] = options_.plan.chunks[static_cast<size_t>(chunk)];
  // Every stage holds the micro-batch (each rank reads the same rows), so each reads its blocks' context.
  const hooks::Tensors x = model_.call_blocks(v == 0 ? model_.call_head(micro_batch, {}) : hooks::Tensors{input}, begin, end, micro_batch);
  return v == spec.virtual_stages() - 1 ? model_.call_tail(x, micro_batch, sums) : x.at(0);
}

double ParallelModel::pipeline_step(const std::vector<Batch>& micro_batches, double loss_scale) {
  KUAFU_CHECK(pipelined(), "pipeline_step on a model without pipeline stages");
  const double loss = train_engine_->run(
      [&](int chunk, const torch::Tensor& input, int micro) {
        return stage_forward(chunk, input, micro_batches[static_cast<size_t>(micro)], false);
      },
      [&](int micro) { return micro_batches[static_cast<size_t>(micro)].inputs; }, loss_scale,
      [this] { model_.block_sites().end_backward_pass(); });
  return loss;
}

torch::Tensor ParallelModel::evaluate(const Batch& batch) {
  torch::NoGradGuard no_grad;
  if (pipelined()) {
    return eval_engine_->evaluate_sums(
        [&](int chunk, const torch::Tensor& input, int) { return stage_forward(chunk, input, batch, true); },
        [&](int) { return batch.inputs; }, /*width=*/3);
  }
  torch::Tensor sums = run_unstaged(batch, /*sums=*/true);
  if (options_.sequence.enabled() && one_stream(model_, "sequence parallelism cuts").tail_per_position()) {
    sums = sums.clone();
    dist::all_reduce(sums, *options_.sequence.group);  // each rank counted its chunk of the positions
  }
  return sums;
}

TiedCopies ParallelModel::tied_copies() const {
  if (!pipelined() || !options_.ends) return {};
  return {tied_, options_.ends, options_.plan.first};
}

parallel::pipeline::StageCosts parameter_costs(hooks::BlockModel& model) {
  const ModuleMap modules = modules_by_path(model.module());
  auto count = [&](const hooks::ModelPart& part) {
    double total = 0;
    for (const auto& path : part.modules) {
      for (const auto& p : modules.at(path)->parameters()) total += static_cast<double>(p.numel());
    }
    return total;
  };
  return {count(model.block_part(0)), count(model.head_part()), count(model.tail_part())};
}

parallel::pipeline::StageCosts measured_costs(hooks::OneStreamModel& model, const Batch& sample) {
  const torch::Device device = sample.inputs.device();
  // A model still described on the meta device (lazy construction) is timed with zeros in the parts
  // timed (head, a block, tail), which then return to the meta device: the time does not depend on
  // the values.
  std::vector<torch::Tensor> timed_on_zeros;
  if (has_meta_parameters(model.module())) {
    pp::StagePlan ends{{{0, 1}}, true, true};
    const StageParts parts = stage_parts(model, ends);
    for (auto& item : model.module().named_parameters()) {
      if (item.value().is_meta() && parts.holds(item.key())) timed_on_zeros.push_back(item.value());
    }
    materialize(model.module(), {device, nullptr, [&](const std::string& name) { return parts.holds(name); }});
  }
  const torch::Tensor random_state = generator_state(device);
  // Median of 3 after a warm-up, each timed until the device has finished.
  auto median_seconds = [&](const std::function<void()>& work) { return time_steps(work, 1, 3, device).median; };
  torch::Tensor stream;
  {
    torch::NoGradGuard no_grad;
    stream = model.head(sample.inputs);
  }
  pp::StageCosts costs;
  costs.head = median_seconds([&] { model.head(sample.inputs).sum().backward(); });
  const torch::Tensor context = model.block_context(sample.inputs);
  costs.block = median_seconds([&] { model.block(0, stream.clone().requires_grad_(), context).sum().backward(); });
  costs.tail = median_seconds([&] { model.tail_loss(stream.clone().requires_grad_(), sample.targets).backward(); });
  // Timing leaves nothing behind: no gradients, the random streams where they were.
  for (auto& p : model.module().parameters()) p.mutable_grad() = torch::Tensor();
  set_generator_state(device, random_state);
  torch::NoGradGuard no_grad;
  for (auto& p : timed_on_zeros) rebind(p, torch::empty(p.sizes(), p.options().device(torch::kMeta)));
  return costs;
}

void check_sequence_parallel(const config::Config& config, torch::nn::Module& model, const sp::SequenceParallel& sequence,
                             const std::string& positions_key, int64_t positions, const std::string& heads_key,
                             const std::string& dropout_key) {
  const std::string size = std::to_string(sequence.size);
  if (positions % sequence.size != 0) {
    config.fail_at(positions_key, "is " + std::to_string(positions) + " but parallel.sequence.size = " + size +
                                      " cuts each sequence into equal chunks; use a multiple of " + size);
  }
  for (const auto& module : model.modules()) {
    const auto* attention = dynamic_cast<const nn::AttentionCoreImpl*>(module.get());
    if (!attention) continue;
    if (sequence.mode == sp::SequenceMode::kAllToAll && attention->heads % sequence.size != 0) {
      config.fail_at(heads_key, "is " + std::to_string(attention->heads) +
                                    " but all_to_all sequence parallelism shares the heads among " + size +
                                    " ranks; use a multiple of " + size + " or mode = \"ring\"");
    }
    if (sequence.mode != sp::SequenceMode::kAllToAll && attention->dropout > 0) {
      config.fail_at(dropout_key, "is " + std::to_string(attention->dropout) +
                                      " but ring attention has no attention-probability dropout; set it to 0 or use "
                                      "parallel.sequence.mode = \"all_to_all\"");
    }
  }
}

void require_data_parallel(const config::Config& config, const Runtime* runtime, const parallel::ModelOptions& options,
                           const std::string& who) {
  if (!runtime) return;
  KUAFU_CHECK(runtime->pipeline.stages == 1 && !runtime->sequence.enabled() && !options.tp.enabled(), who,
              " trains data parallel (with ZeRO or Gemini); set parallel.pipeline, parallel.sequence and parallel.tensor to 1 in ",
              config.path());
}

void checkpoint_from_config(const config::Config& config, hooks::BlockSites& sites,
                            const std::vector<std::string>& default_blocks) {
  if (!config.get_bool("memory.activation_checkpointing")) return;
  const std::vector<std::string> chosen = config.get_string_list("memory.checkpoint_blocks");
  memory::checkpoint_blocks(sites, chosen.empty() ? default_blocks : chosen);
}

void check_row_blocks(const config::Config& config, const parallel::TensorParallel& tp,
                      const std::vector<std::string>& keys) {
  const int blocks = tp.batch_blocks();
  for (const auto& key : keys) {
    if (config.get_int(key) % blocks != 0) {
      config.fail_at(key, "is " + std::to_string(config.get_int(key)) + " but parallel.tensor.mode = \"" +
                              parallel::mode_name(tp.spec.mode) + "\" cuts each batch into " + std::to_string(blocks) +
                              " row blocks; use a multiple of " + std::to_string(blocks));
    }
  }
}

ParallelOptions parallel_options(hooks::BlockModel& model, const config::Config& config, const Runtime& runtime,
                                 const Batch& sample) {
  ParallelOptions options;
  options.sequence = runtime.sequence;
  options.checkpoint_activations = config.get_bool("memory.activation_checkpointing");
  options.checkpoint_blocks = config.get_string_list("memory.checkpoint_blocks");
  if (!runtime.pipelined()) return options;
  pp::ScheduleSpec spec = runtime.pipeline;
  spec.micro_batches = static_cast<int>(accumulation_steps(config, runtime));
  const int64_t blocks = model.num_blocks();
  if (blocks < spec.virtual_stages()) {
    config.fail_at("parallel.pipeline", "gives " + std::to_string(spec.virtual_stages()) +
                                            " (virtual) stages, each needing at least one of the model's " +
                                            std::to_string(blocks) + " blocks (layers)");
  }
  if (spec.kind == pp::ScheduleKind::kInterleaved && spec.micro_batches % spec.stages != 0) {
    config.fail_at("train.batch_size", "gives " + std::to_string(spec.micro_batches) +
                                           " micro-batches per step, but the interleaved schedule needs a multiple "
                                           "of parallel.pipeline = " + std::to_string(spec.stages));
  }
  options.schedule = spec;
  options.pipeline = runtime.mesh->group("pipeline");
  options.ends = pp::first_and_last_stage_group(*runtime.mesh);
  const std::string partition = config.get_string("parallel.partition");
  if (partition == "uniform") {
    options.plan = pp::stage_plan(spec, runtime.stage(), blocks);
    return options;
  }
  pp::StageCosts costs = partition == "parameters" ? parameter_costs(model) : measured_costs(one_stream(model, "parallel.partition = \"time\" times"), sample);
  // Every rank must cut alike: rank 0's figures (timings differ between processes).
  const auto& world = *runtime.world->world_group();
  torch::Tensor shared =
      torch::tensor({costs.block, costs.head, costs.tail}, torch::TensorOptions(torch::kFloat64).device(world.device()));
  dist::broadcast(shared, world, 0);
  costs = {shared[0].item<double>(), shared[1].item<double>(), shared[2].item<double>()};
  options.plan = pp::stage_plan(spec, runtime.stage(), blocks, costs);
  log::infof("pipeline stage ", runtime.stage(), " holds blocks ", options.plan.chunks.front().first, "..",
             options.plan.chunks.back().second - 1, " (", partition, ": block ", costs.block, ", head +", costs.head,
             ", tail +", costs.tail, ")");
  return options;
}

}  // namespace kuafu::train

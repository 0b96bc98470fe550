#include "core/train/model_state.h"

#include <cmath>
#include <filesystem>

#include "core/dist/collectives.h"
#include "core/hooks/grad_ready.h"
#include "core/memory/frozen_offload.h"
#include "core/memory/memory_config.h"
#include "core/optim/grad_norm.h"
#include "core/optim/optim_config.h"
#include "core/train/checkpoint.h"
#include "core/train/held_model.h"
#include "core/util/logging.h"

namespace kuafu::train {
namespace fs = std::filesystem;

ModelState::ModelState(const config::Config& config, const Runtime& runtime, torch::nn::Module& model,
                       ModelStateOptions options)
    : config_(config), runtime_(runtime), model_(model), options_(std::move(options)) {
  schedule_ = std::make_unique<optim::LrSchedule>(optim::make_schedule(config, options_.steps));
  // Everything the step touches lives on the run's device: the weights are made there (the layers take
  // the device from runtime.model_options()), masters, gradients and optimizer state follow them, and the tasks
  // put their batches there.
  // A lazily built model leaves its trainable weights on the meta device for the sharded strategy.
  const HeldModel& held = held_model(config);
  const std::string& strategy = held.strategy;
  const bool deferred = options_.deferred && held.sharded();
  const bool frozen_on_host = held.offload_frozen;
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (deferred && p.is_meta() && p.requires_grad()) continue;
    if (frozen_on_host && p.device().is_cpu() && !p.requires_grad()) continue;  // made there (lazy construction)
    KUAFU_CHECK(!p.is_meta(), "parameter ", item.key(), " is still on the meta device and nothing fills it: a task "
                              "built lazily passes its DeferredWeights on (TrainTask::deferred_weights)",
                deferred ? "" : ", and only memory.strategy zero1, zero2 or gemini fills trained weights later");
    KUAFU_CHECK(p.device() == runtime.device, "the model made parameter ", item.key(), " on ", p.device().str(),
                ", not on the run's device ", runtime.device.str(),
                ": build its layers with runtime.model_options() (its device)");
  }
  dtype_ = train::compute_dtype(config, runtime.device);
  scaler_ = optim::make_loss_scaler(config, dtype_);
  // Gradients are averaged over the data ranks and, with sequence parallelism, over the ranks that
  // computed the other chunks of the same sequences (each rank's loss is the mean over its tokens).
  const dist::GroupPtr replicas = runtime.replica_group();
  ema_decay_ = config.get_float("optim.ema_decay");
  ema_warmup_ = {config.get_string("optim.ema_warmup"), config.get_float("optim.ema_inv_gamma"), config.get_float("optim.ema_power")};
  // 1 with a moving average: Gemini counts it with its master chunk (the disk tier's record holds it after the
  // optimizer's slots; in memory it is a tensor on its master's tier).
  const int ema_slots = ema_decay_ > 0 ? 1 : 0;
  if (held.sharded()) {
    // Under tensor parallelism each rank's blocks are sharded over the data ranks that hold the same blocks.
    // A pipeline step accumulates whole gradients through its micro-batches and reduces them once: ZeRO-2
    // then holds them as ZeRO-1 does (DeepSpeed and Colossal-AI refuse ZeRO-2 with pipelines outright).
    // Gemini reduces each micro-batch's backward at its end (told through the block hooks).
    const auto disk = strategy == "gemini" ? disk_tier_options(config) : std::nullopt;
    if (disk && runtime.pipelined()) {
      config.fail_at("memory.disk_dir", "holds Gemini's master chunks without parallel.pipeline (a pipeline sums tied "
                                        "weights' gradients in memory)");
    }
    sharded_ = memory::make_sharded_states(config, strategy, model, replicas, dtype_, /*whole_gradients=*/runtime.pipelined(),
                                           deferred ? options_.deferred : DeferredWeights{}, disk,
                                           disk ? optim::state_slots(config) + ema_slots : 0);
    if (deferred) load_deferred_weights();
    if (runtime.pipelined() && strategy == "zero2" && runtime.is_main()) {
      log::infof("memory.strategy = \"zero2\" with parallel.pipeline keeps whole gradients through each step, as zero1 "
                 "(the micro-batches' backwards interleave); optimizer state and masters stay sharded");
    }
    if (auto* strategy_hooks = dynamic_cast<hooks::BlockHooks*>(sharded_.get())) {
      hooks_installed_ = options_.set_block_hooks && options_.set_block_hooks(strategy_hooks);
      if (!hooks_installed_) {
        config.fail_at("memory.strategy", "(\"" + strategy + "\") needs a model that runs its blocks through the "
                                          "block-call interface, and this app's model does not yet; use zero1 or zero2");
      }
    }
    // Each rank holds disjoint pieces of the masters: norms add up over the replicas, and with tensor or
    // pipeline parallelism over every rank (a block replicated over the tensor group, or a weight tied
    // across stages, counted on one of them).
    params_ = sharded_->params();
    norm_group_ = replicas;
    if (runtime.tensor.enabled() || runtime.pipelined()) {
      layouts_ = parallel::collect_layouts(model_);
      // A parameter's norm (LAMB's and LARS's trust ratios) adds its pieces over the replicas and its
      // blocks over the tensor axes at once.
      for (auto& p : params_) {
        if (auto group = parallel::shard_group(layout_of(p.name), *runtime.mesh, runtime.replica_axes())) p.shard_group = group;
      }
      mark_tensor_parallel_params();
      norm_group_ = runtime.world->world_group();
    }
  } else {
    init_replicated(replicas);
  }
  if (frozen_on_host) offload_frozen_weights();
  optimizer_ = optim::make_optimizer(config, params_, norm_group_);
  std::map<std::string, torch::Tensor> ema_homes;  // the moving average's place in a disk record, by parameter
  if (sharded_) {
    // May move masters to the device.
    sharded_->account_optimizer_state(optimizer_->state_slots() + ema_slots);
    // The optimizer state (and moving average) of master chunks on the disk tier lives in their records there.
    for (auto& [name, slots] : sharded_->optimizer_state_homes()) {
      if (ema_slots > 0) {
        ema_homes[name] = slots.back();
        slots.pop_back();
      }
      optimizer_->set_state(name, std::move(slots));
    }
    if (runtime.is_main()) log::infof(sharded_->describe());
  }
  if (streams_masters() && config.schema().find("train.async_save") && config.get_bool("train.async_save")) {
    config.fail_at("train.async_save", "snapshots the weights and optimizer state in host memory, which master chunks "
                                       "on the disk tier (memory.disk_dir) do not fit in; save synchronously");
  }
  if (ema_decay_ > 0) {
    for (const auto& p : params_) {
      const auto home = ema_homes.find(p.name);
      ema_.push_back(home != ema_homes.end() ? home->second : p.tensor.detach().clone());
    }
    // The averages in the disk records start as the weights too.
    if (streams_masters()) {
      torch::NoGradGuard no_grad;
      sharded_->visit_masters_on_disk(/*changed=*/true, /*masters_changed=*/false, [&](const std::vector<size_t>& pieces) {
        for (size_t i : pieces) ema_[i].copy_(params_[i].tensor.detach());
      });
    }
  }
}

ModelState::~ModelState() {
  // The model must not call into hooks that are gone.
  if (hooks_installed_) options_.set_block_hooks(nullptr);
  frozen_offload_.reset();  // the frozen weights return to the device
}

void ModelState::load_deferred_weights() {
  if (!options_.deferred.load) return;
  // The starting weights (model.init_from) go into the masters and compute copies one tensor at a time,
  // as a checkpoint's do.
  WeightSink sink;
  sink.device = runtime_.device;
  sink.wants = [this](const std::string& name) { return sharded_->chunked(name); };
  sink.take = [this](const std::string& name, const torch::Tensor& value) { sharded_->load_weight(name, value); };
  ScopedWeightSink scope(sink);
  options_.deferred.load();
  sharded_->close_disk_chunk();  // load_weight opened chunks on the disk tier one at a time
}

void ModelState::offload_frozen_weights() {
  const std::string key = "memory.offload_frozen";
  if (held_model(config_).sharded()) {
    config_.fail_at(key, "keeps frozen weights on the host by itself: use it with memory.strategy = \"none\" "
                         "(the trainable LoRA adapters are small)");
  }
  if (!config_.get_bool("memory.activation_checkpointing")) {
    config_.fail_at(key, "needs memory.activation_checkpointing = true: a forward that keeps a block's weights for "
                         "its backward would keep every block's on the device");
  }
  if (runtime_.tensor.enabled() || runtime_.pipelined()) {
    config_.fail_at(key, "runs without parallel.tensor and parallel.pipeline");
  }
  // After the masters: the frozen weights are already in the compute dtype. Their home is host memory, or
  // files on the disk tier under memory.disk_dir.
  frozen_offload_ = std::make_unique<memory::FrozenWeightOffload>(model_, runtime_.device, disk_tier_options(config_));
  hooks_installed_ = options_.set_block_hooks && options_.set_block_hooks(frozen_offload_.get());
  if (!hooks_installed_) config_.fail_at(key, "needs a model that runs its blocks through the block-call interface");
  if (runtime_.is_main()) log::infof(frozen_offload_->describe());
}

void ModelState::init_replicated(const dist::GroupPtr& replicas) {
  // Casting to the compute dtype comes first: data parallelism sizes its buckets by the parameters' dtype.
  masters_ = std::make_unique<optim::MasterWeights>(model_, dtype_);
  // On one replica too: the buckets are where gradients accumulate, float32 ones under bf16/fp16 (unless
  // precision.grad_reduce = "compute"), and those are the masters' gradients themselves.
  parallel::DataParallelOptions options;
  options.grad_reduce = optim::grad_reduce(config_);
  data_parallel_ = std::make_unique<parallel::DataParallel>(model_, replicas, options);
  masters_->use_grads(data_parallel_->grads());
  // The model now holds rank 0's weights; the masters must too.
  if (replicas->size() > 1 && masters_->has_copies()) {
    for (const auto& p : masters_->params()) dist::broadcast(const_cast<torch::Tensor&>(p.tensor), *replicas);
  }
  // Tensor-parallel blocks tell the optimizer their shard group and who counts them in the global norm.
  layouts_ = parallel::collect_layouts(model_);
  params_ = masters_->params();
  if (runtime_.tensor.enabled()) {
    for (auto& p : params_) p.shard_group = parallel::shard_group(layout_of(p.name), *runtime_.mesh);
  }
  mark_tensor_parallel_params();
  // Norms span every rank holding part of the model: its pipeline stages and tensor blocks.
  norm_group_ = runtime_.model_group();
}

void ModelState::mark_tensor_parallel_params() {
  for (auto& p : params_) {
    if (runtime_.tensor.enabled()) {
      p.counts_in_global_norm =
          parallel::counts_in_global_norm(layout_of(p.name), runtime_.tensor.axes(), *runtime_.mesh);
    }
    p.counts_in_global_norm = p.counts_in_global_norm && options_.tied.counts(p.name);
  }
}

parallel::Layout ModelState::layout_of(const std::string& name) const {
  const auto found = layouts_.find(name);
  return found == layouts_.end() ? parallel::Layout{} : found->second;
}

double ModelState::start_step(int64_t step) {
  const double lr = learning_rate(step);
  optimizer_->set_lr(lr);
  return lr;
}

void ModelState::begin_backward(bool last) {
  if (data_parallel_) data_parallel_->begin_backward(last);
  if (sharded_) sharded_->begin_backward(last);
}

void ModelState::end_backward() {
  if (data_parallel_) data_parallel_->finish_backward();
  if (sharded_) sharded_->finish_backward();
}

void ModelState::begin_pipelined_backward() {
  if (data_parallel_) data_parallel_->begin_backward(/*sync=*/false);
  if (sharded_) sharded_->begin_backward(/*sync=*/false);
}

void ModelState::end_pipelined_backward() {
  if (data_parallel_) data_parallel_->reduce_now();
  if (sharded_) sharded_->reduce_accumulated();
  sum_tied_gradients();
}

void ModelState::sum_tied_gradients() {
  if (options_.tied.names.empty()) return;
  const auto params = model_.named_parameters();
  for (const auto& name : options_.tied.names) {
    if (!params[name].requires_grad()) continue;  // frozen: no gradient
    if (sharded_) {
      sharded_->sum_gradient_with_copies(name, *options_.tied.group);
    } else {
      torch::Tensor grad = hooks::grad_of(params[name]);  // the float32 main gradient under bf16 / fp16
      dist::all_reduce(grad, *options_.tied.group);
    }
  }
}

void ModelState::drop_partial_step() {
  if (data_parallel_) data_parallel_->reduce_now();
  if (sharded_) sharded_->finish_backward();
  zero_grads();
}

void ModelState::zero_grads() {
  if (sharded_) {
    sharded_->zero_grad();
  } else if (data_parallel_) {
    data_parallel_->zero_grad();
  } else {
    for (auto& p : model_.parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }
}

double ModelState::grad_norm() {
  if (masters_) masters_->copy_grads_to_masters();
  // Gradients on the disk tier count by the squares taken as they were written.
  const std::vector<torch::Tensor> known = sharded_ ? sharded_->known_grad_squares() : std::vector<torch::Tensor>{};
  return optim::global_grad_norm(params_, norm_group_, known) / loss_scale();
}

bool ModelState::streams_masters() const { return sharded_ && sharded_->masters_on_disk(); }

void ModelState::step_streamed(double factor, double ema_decay) {
  // The masters in memory first, then each chunk on the disk as it streams through: one step in parts.
  std::vector<bool> on_disk(params_.size());
  std::vector<optim::Param> in_memory;
  for (size_t i = 0; i < params_.size(); ++i) {
    on_disk[i] = sharded_->piece_on_disk(i);
    if (!on_disk[i]) in_memory.push_back(params_[i]);
  }
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].name] = i;
  optimizer_->begin_step();
  optim::scale_grads(in_memory, factor);
  optimizer_->update([&](const std::string& name) { return !on_disk[index.at(name)]; });
  sharded_->step_masters_on_disk([&](const std::vector<size_t>& pieces) {
    std::vector<optim::Param> part;
    std::vector<bool> in_part(params_.size(), false);
    for (size_t i : pieces) {
      part.push_back(params_[i]);
      in_part[i] = true;
    }
    optim::scale_grads(part, factor);
    optimizer_->update([&](const std::string& name) { return in_part[index.at(name)]; });
    if (!ema_.empty()) {
      for (size_t i : pieces) average_piece(i, ema_decay);  // while its record is in memory
    }
  });
}

double ModelState::grad_clip() const { return config_.get_float("optim.grad_clip"); }

void ModelState::finish_step(double grad_norm, double max_norm, bool overflow) {
  if (!overflow) {
    // Unscaling and clipping are one multiplication of the gradients.
    const double factor = optim::clip_coefficient(grad_norm, max_norm) / loss_scale();
    const double ema_decay = ema_.empty() ? 0.0 : next_ema_decay();
    if (streams_masters()) {
      step_streamed(factor, ema_decay);
    } else {
      optimizer_->step(factor);
    }
    if (sharded_) {
      sharded_->copy_masters_to_model();
    } else {
      masters_->copy_masters_to_model();
    }
    update_ema(ema_decay);
  }
  if (scaler_) scaler_->update(overflow);
  zero_grads();
}

std::optional<std::string> ModelState::device_step_refusal() const {
  if (sharded_) return "memory.strategy " + held_model(config_).strategy + " moves chunks between the device and the host";
  if (frozen_offload_) return "memory.offload_frozen brings frozen weights from the host a block at a time";
  if (runtime_.world->size() > 1) return "it runs on one process (this run has " + std::to_string(runtime_.world->size()) + ")";
  if (scaler_) return "fp16's loss scaler decides each step on the host (use bf16)";
  if (!ema_.empty()) return "optim.ema_decay's moving average is updated on the host's schedule";
  if (!optimizer_->can_step_on_device()) return "optimizer " + optimizer_->name() + " has no step on the device (AdamW has)";
  return std::nullopt;
}

void ModelState::prepare_device_step() {
  if (const auto refusal = device_step_refusal()) fail("a step on the device is refused: " + *refusal);
  optimizer_->prepare_device_step();
}

torch::Tensor ModelState::finish_step_on_device(double max_norm) {
  torch::NoGradGuard no_grad;
  masters_->copy_grads_to_masters();  // plain replicas (device_step_refusal): masters_ is set
  const torch::Tensor norm = optim::global_grad_norm_tensor(params_, norm_group_);  // [1] float64
  const auto scalar = torch::TensorOptions(torch::kFloat32);
  const torch::Tensor skip = norm.isfinite().logical_not().to(scalar).reshape({});
  optimizer_->step_on_device(optim::clip_coefficient(norm, max_norm).to(scalar).reshape({}), skip);
  masters_->copy_masters_to_model();
  zero_grads();
  return norm;
}

void ModelState::swap_ema() {
  if (ema_.empty()) return;
  torch::NoGradGuard no_grad;
  const auto swap = [&](size_t i) {
    torch::Tensor& master = params_[i].tensor;
    const torch::Tensor live = master.clone();
    master.copy_(ema_[i]);
    ema_[i].copy_(live);
  };
  const bool streamed = streams_masters();
  for (size_t i = 0; i < ema_.size(); ++i) {
    if (!streamed || !sharded_->piece_on_disk(i)) swap(i);
  }
  if (streamed) {  // a chunk at a time, its compute copy taking the swapped masters
    sharded_->visit_masters_on_disk(/*changed=*/true, /*masters_changed=*/true, [&](const std::vector<size_t>& pieces) {
      for (size_t i : pieces) swap(i);
    });
  }
  if (sharded_) {
    sharded_->copy_masters_to_model();
  } else {
    masters_->copy_masters_to_model();
  }
}

namespace {

double ema_decay_at(double decay, const EmaWarmup& warmup, int64_t update) {
  if (warmup.kind == "none") return decay;
  // diffusers' EMAModel.get_decay: the first update copies the weights, the k-th (k ≥ 2) keeps, with step = k − 1,
  // min(decay, (1 + step) / (10 + step)) of the average, or with use_ema_warmup min(decay, 1 − (1 + step / inv_gamma)^−power).
  const auto step = static_cast<double>(update - 1);
  if (step <= 0) return 0.0;
  if (warmup.kind == "power") return std::min(decay, 1 - std::pow(1 + step / warmup.inv_gamma, -warmup.power));
  return std::min(decay, (1 + step) / (10 + step));
}

}  // namespace

double ModelState::next_ema_decay() { return ema_decay_at(ema_decay_, ema_warmup_, ++ema_updates_); }

void ModelState::average_piece(size_t i, double decay) {
  torch::NoGradGuard no_grad;
  const torch::Tensor master = params_[i].tensor.detach();
  // Gemini's ledger counts the average with its master's chunk: it follows a master moved to the other tier,
  // as the optimizer's state does at its next step.
  if (ema_[i].device() != master.device()) ema_[i] = ema_[i].to(master.device());
  ema_[i].mul_(decay).add_(master, 1.0 - decay);
}

void ModelState::update_ema(double decay) {
  const bool streamed = streams_masters();
  for (size_t i = 0; i < ema_.size(); ++i) {
    if (!streamed || !sharded_->piece_on_disk(i)) average_piece(i, decay);  // the disk's as they streamed
  }
}

io::NamedTensors ModelState::full_ema() const {
  std::vector<torch::Tensor> values = ema_;
  if (streams_masters()) {  // the disk records' averages read into memory
    sharded_->visit_masters_on_disk(/*changed=*/false, /*masters_changed=*/false, [&](const std::vector<size_t>& pieces) {
      for (size_t i : pieces) values[i] = ema_[i].clone();
    });
  }
  io::NamedTensors pieces;
  for (size_t i = 0; i < ema_.size(); ++i) pieces.emplace_back(params_[i].name + "/ema", values[i]);
  io::NamedTensors full = whole(sharded_ ? sharded_->full_state(pieces) : pieces);
  for (auto& item : full) item.first = *optim::state_owner(item.first);  // "<param>/ema" -> "<param>"
  return full;
}

std::vector<std::pair<std::string, double>> ModelState::memory_figures() const {
  return sharded_ ? sharded_->memory_figures() : std::vector<std::pair<std::string, double>>{};
}

io::NamedTensors ModelState::whole(io::NamedTensors tensors) const {
  if (runtime_.tensor.enabled()) {
    for (auto& [name, tensor] : tensors) {
      const auto owner = optim::state_owner(name);
      tensor = parallel::gather_full(tensor, layout_of(owner ? *owner : name), *runtime_.mesh);
    }
  }
  if (runtime_.pipelined()) {
    // Rank 0 writes the checkpoint: the stages of its pipeline line send it their tensors.
    bool rank0_line = runtime_.mesh->coordinate("data") == 0;
    for (const auto& axis : runtime_.tensor.axes()) rank0_line = rank0_line && runtime_.mesh->coordinate(axis) == 0;
    if (rank0_line) tensors = gather_pipeline_stages(std::move(tensors), *runtime_.mesh->group("pipeline"));
  }
  return tensors;
}

PiecePlace ModelState::place_in_whole(const std::string& name, std::vector<int64_t> block, int64_t offset) const {
  PiecePlace place;
  if (runtime_.tensor.enabled()) place.cuts = parallel::block_cuts(layout_of(name), *runtime_.mesh);
  for (const auto& cut : place.cuts) block[static_cast<size_t>(cut.dim)] *= cut.count;
  place.shape = std::move(block);
  place.offset = offset;
  return place;
}

std::vector<TensorPiece> ModelState::owned_pieces(const io::NamedTensors& tensors) const {
  const bool replica_writes = runtime_.replica_group()->rank() == 0;
  std::vector<TensorPiece> pieces;
  for (const auto& [name, tensor] : tensors) {
    const auto owner = optim::state_owner(name);
    if (!owner && name == "step") {  // the optimizer's step counter, alike on every rank
      if (runtime_.world->rank() == 0) pieces.push_back(whole_piece(name, tensor));
      continue;
    }
    const std::string& of = owner ? *owner : name;
    // Replicated over a tensor axis its layout does not split, or the second copy of a tied weight.
    if (runtime_.tensor.enabled() &&
        !parallel::counts_in_global_norm(layout_of(of), runtime_.tensor.axes(), *runtime_.mesh)) {
      continue;
    }
    if (!options_.tied.counts(of)) continue;
    const bool chunked = sharded_ && sharded_->chunked(of);
    if (!chunked && !replica_writes) continue;  // data replicas hold it alike
    if (tensor.numel() == 0 && chunked) continue;  // none of it falls in this rank's shard
    pieces.push_back({name, tensor,
                      chunked ? place_in_whole(of, sharded_->shape_of(of), sharded_->piece_offset(of))
                              : place_in_whole(of, tensor.sizes().vec(), 0)});
  }
  return pieces;
}

io::NamedTensors ModelState::with_frozen_values(io::NamedTensors weights) const {
  return frozen_offload_ ? frozen_offload_->with_values_from_disk(std::move(weights)) : weights;
}

std::vector<CheckpointPart> ModelState::checkpoint_parts() const {
  CheckpointPart saved;
  saved.name = options_.name;
  saved.optimizer_name = optimizer_->name();
  saved.sharded = true;
  if (sharded_) {
    // The model's tensors in its own order, the chunked ones as this rank's pieces of the masters.
    std::map<std::string, torch::Tensor> pieces;
    for (const auto& p : params_) pieces[p.name] = p.tensor;
    saved.weight_pieces = owned_pieces(optim::weights_replacing(model_, pieces));
    if (streams_masters()) {
      // Masters and state on the disk tier come into memory a chunk at a time as the files are written.
      memory::ChunkedMasters* chunks = sharded_.get();
      saved.before_write = [chunks](const torch::Tensor& t) { chunks->open_disk_chunk_of(t, /*will_change=*/false); };
      saved.after_write = [chunks] { chunks->close_disk_chunk(); };
    }
  } else {
    saved.weight_pieces = owned_pieces(with_frozen_values(masters_->weights()));
  }
  saved.state_pieces = owned_pieces(optimizer_->state_tensors());
  std::vector<CheckpointPart> parts = {std::move(saved)};
  if (!ema_.empty()) {
    io::NamedTensors ema;
    for (size_t i = 0; i < ema_.size(); ++i) ema.emplace_back(params_[i].name, ema_[i]);
    CheckpointPart average{ema_part(), {}, {}, "", true, owned_pieces(ema), {}};
    if (streams_masters()) {  // the averages in the disk records, as the masters above
      memory::ChunkedMasters* chunks = sharded_.get();
      average.before_write = [chunks](const torch::Tensor& t) { chunks->open_disk_chunk_of(t, /*will_change=*/false); };
      average.after_write = [chunks] { chunks->close_disk_chunk(); };
    }
    parts.push_back(std::move(average));
  }
  return parts;
}

void ModelState::save_scaler_state(nlohmann::json& trainer_state) const {
  if (scaler_) trainer_state[scaler_key()] = scaler_->state();
  if (!ema_.empty()) trainer_state[ema_updates_key()] = ema_updates_;
}

void ModelState::load(const std::string& folder, const nlohmann::json& trainer_state) {
  using LocalPart = CheckpointStore::LocalPart;
  CheckpointStore::LoadTarget target;
  target.rank = runtime_.world->rank();
  // A tensor's tensor-parallel block on this rank (a block of `block` shape), and (sharded) this rank's
  // run of that block's elements: only those bytes of the checkpoint are read.
  const auto block_of = [&](const std::string& name, const std::vector<int64_t>& block) -> std::optional<LocalPart> {
    if (!runtime_.tensor.enabled()) return std::nullopt;
    return LocalPart{place_in_whole(name, block, 0), block};
  };
  const auto piece_of = [&](const std::string& name) {
    return LocalPart{place_in_whole(name, sharded_->shape_of(name), sharded_->piece_offset(name)),
                     {sharded_->piece_numel(name)}};
  };
  io::NamedTensors weights;
  if (sharded_) {
    weights = sharded_->weights_to_load();  // blocks, the chunked ones of no memory (stored by the strategy)
    target.store = [&](const std::string& name, const torch::Tensor& block) { sharded_->load_weight(name, block); };
    target.state_place = [&](const std::string& name) -> std::optional<LocalPart> { return piece_of(name); };
  } else {
    weights = with_frozen_values(masters_->weights());  // host copies of a base on the disk, to load into
  }
  std::map<std::string, std::vector<int64_t>> blocks;
  for (const auto& [name, tensor] : weights) blocks[name] = tensor.sizes().vec();
  target.weight_place = [&](const std::string& name) { return block_of(name, blocks.at(name)); };
  target.part = runtime_.pipelined();
  if (streams_masters()) {
    // Masters and state on the disk tier take the checkpoint a chunk at a time (load_weight opens its chunk).
    target.before_state = [&](const std::string& param) { sharded_->open_disk_chunk_of(param, /*will_change=*/true); };
  }
  CheckpointStore::load(folder, weights, *optimizer_, target, options_.name);
  if (sharded_) sharded_->close_disk_chunk();
  if (frozen_offload_) frozen_offload_->write_values_to_disk(weights);  // the loaded base into its files
  if (!sharded_) masters_->copy_masters_to_model();
  if (!ema_.empty()) {
    io::NamedTensors ema;  // this rank's pieces or blocks of the averages
    for (size_t i = 0; i < ema_.size(); ++i) ema.emplace_back(params_[i].name, ema_[i]);
    const CheckpointStore::PlaceOf ema_place = [&](const std::string& name) -> std::optional<LocalPart> {
      if (sharded_) return piece_of(name);
      return block_of(name, blocks.at(name));
    };
    // The averages in the disk records take theirs a chunk at a time.
    const auto open_record = [&](const std::string& param) { sharded_->open_disk_chunk_of(param, /*will_change=*/true); };
    CheckpointStore::load_weights(folder, ema, ema_place, ema_part(), /*subset=*/runtime_.pipelined(),
                                  streams_masters() ? std::function<void(const std::string&)>(open_record) : nullptr);
    if (sharded_) sharded_->close_disk_chunk();
    // A checkpoint from before the count was kept: as many updates as steps, far past any warm-up.
    const auto count = trainer_state.find(ema_updates_key());
    ema_updates_ = count != trainer_state.end() && count->is_number_integer() ? count->get<int64_t>() : int64_t{1} << 40;
  }
  if (scaler_ && trainer_state.contains(scaler_key())) {
    try {
      scaler_->load_state(trainer_state.at(scaler_key()));
    } catch (const Error& e) {
      throw Error(detail::concat((fs::path(folder) / "trainer.json").string(), ": \"", scaler_key(), "\": ", e.what()));
    }
  }
}

}  // namespace kuafu::train

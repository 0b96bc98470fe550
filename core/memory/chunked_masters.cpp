#include "core/memory/chunked_masters.h"

#include <algorithm>
#include <map>

#include "core/hooks/grad_ready.h"
#include "core/optim/optimizer.h"
#include "core/optim/mixed_precision.h"
#include "core/util/device.h"
#include "core/util/error.h"

namespace kuafu::memory {

torch::Tensor copy_to(const torch::Tensor& t, const torch::Device& device, bool pinned) {
  torch::NoGradGuard no_grad;
  return torch::empty(t.sizes(), t.options().device(device).pinned_memory(pinned)).copy_(t);
}

std::vector<std::string> trainable_names(const torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) {
    if (item.value().requires_grad()) names.push_back(item.key());
  }
  return names;
}

ChunkedMasters::ChunkedMasters(torch::nn::Module& model, dist::GroupPtr group, std::vector<std::string> names,
                               int64_t chunk_numel, torch::Dtype dtype, optim::GradReduce grad_reduce,
                               DeferredWeights deferred, int64_t search_max_numel)
    : model_(model),
      group_(std::move(group)),
      rank_(group_->rank()),
      dtype_(dtype),
      grad_dtype_(optim::grad_dtype(dtype, grad_reduce)),
      device_(deferred ? deferred.device : torch::Device(torch::kCPU)),
      deferred_(std::move(deferred)),
      names_(std::move(names)) {
  KUAFU_CHECK(!names_.empty(), "the model has no trainable parameters to shard");
  const auto named = model.named_parameters();
  std::vector<int64_t> numels;
  bool any_meta = false;
  for (const auto& name : names_) {
    const torch::Tensor& p = named[name];
    const torch::Tensor& first = named[names_.front()];
    KUAFU_CHECK(p.is_floating_point(), "parameter '", name, "' is not floating-point");
    KUAFU_CHECK(p.scalar_type() == first.scalar_type(), "parameter '", name, "' differs in dtype from '",
                names_.front(), "'");
    if (p.is_meta()) {
      any_meta = true;
    } else {
      if (!deferred_ && params_.empty()) device_ = p.device();
      KUAFU_CHECK(p.device() == device_, "parameter '", name, "' is on ", p.device().str(), ", not on ",
                  device_.str(), " where the model computes");
    }
    params_.push_back(p);
    shapes_.push_back(p.sizes().vec());
    numels.push_back(p.numel());
  }
  // Full precision (fp32, fp64): the masters are the compute weights, in the compute dtype whatever the model
  // was made in (a lazily made model is described in float32).
  master_dtype_ = low_precision(dtype_) ? torch::kFloat32 : dtype_;
  // The search stays below 1/kMinChunks of the model (or twice its largest tensor), so that a small
  // model still has chunks fine enough to place and to overlap communication with.
  int64_t total = 0, largest = 0;
  for (int64_t n : numels) {
    total += n;
    largest = std::max(largest, n);
  }
  int64_t search_max = std::min<int64_t>(kMaxChunkBytes / static_cast<int64_t>(torch::elementSize(dtype_)),
                                         std::max(total / kMinChunks, 2 * largest));
  if (search_max_numel > 0) search_max = std::min(search_max, search_max_numel);
  const int64_t chunk = chunk_numel > 0 ? chunk_numel : search_chunk_numel(numels, 0, search_max, 1024, group_->size());
  layout_.emplace(numels, chunk, group_->size());
  KUAFU_CHECK(!any_meta || deferred_, "the model's trainable parameters are on the meta device and nothing "
                                      "says how to fill them (lazy construction without DeferredWeights)");
  // Rank 0's initial weights everywhere, as plain data parallelism does.
  torch::NoGradGuard no_grad;
  for (auto param : model.parameters()) {
    if (!param.is_meta()) dist::broadcast(param, *group_, 0);
  }
  for (auto buffer : model.buffers()) dist::broadcast(buffer, *group_, 0);
}

ChunkedMasters::~ChunkedMasters() = default;

void ChunkedMasters::reduce_accumulated() { fail(describe() + ": cannot reduce a pipeline step's gradients"); }

void ChunkedMasters::build_masters(const std::function<torch::Tensor(int64_t, const torch::Tensor&)>& keep) {
  torch::NoGradGuard no_grad;
  const int64_t chunks = layout_->num_chunks();
  const auto options = torch::TensorOptions(master_dtype_).device(device_);
  master_shards_.resize(chunks);
  grad_shards_.resize(chunks);
  disk_records_.resize(chunks);
  grad_squares_.resize(names_.size());
  // A chunk is filled whole in the parameters' own precision (the masters are never rounded) and
  // handed to `keep` once its last tensor has arrived.
  std::vector<torch::Tensor> filling(chunks);
  std::vector<size_t> arrived(chunks, 0);
  std::vector<bool> has_value(names_.size(), false);
  std::vector<torch::Tensor> piece_masters(names_.size()), piece_grads(names_.size());
  disk_state_.resize(names_.size());
  auto arrive = [&](int64_t i, const torch::Tensor& value) {
    KUAFU_CHECK(!has_value[i], "parameter '", names_[i], "' was given its initial value twice");
    KUAFU_CHECK(value.numel() == layout_->slot(i).numel, "the initial value of '", names_[i], "' has ", value.numel(),
                " elements, the parameter ", layout_->slot(i).numel);
    has_value[i] = true;
    const int64_t c = layout_->slot(i).chunk;
    if (!filling[c].defined()) filling[c] = torch::zeros({layout_->chunk_numel(c)}, options);
    filling[c].narrow(0, layout_->slot(i).offset, value.numel()).copy_(value.reshape(-1));
    if (++arrived[c] < layout_->tensors_in(c).size()) return;
    master_shards_[c] = keep(c, filling[c]);
    grad_shards_[c] = disk_records_[c].defined() ? mapped_host_tensor(layout_->shard_numel(c)).zero_()
                                                 : torch::zeros({layout_->shard_numel(c)}, master_shards_[c].options());
    filling[c] = torch::Tensor();
    // The pieces' views, made while the chunk's memory is there: a chunk on the disk tier is written there
    // now and its memory given back (a view of storage without memory cannot be made).
    for (int64_t t : layout_->tensors_in(c)) {
      const Piece piece = layout_->piece(t, rank_);
      // An alias of the shard, not a view: a view would keep its base, the shard, alive after
      // relocate_masters gives the piece new storage.
      piece_masters[t] = master_shards_[c].narrow(0, piece.shard_offset, piece.numel).detach();
      piece_grads[t] = grad_shards_[c].narrow(0, piece.shard_offset, piece.numel);
      if (!disk_records_[c].defined()) continue;
      const int64_t n = layout_->shard_numel(c);
      for (int s = 0; s < disk_slots_; ++s) {
        disk_state_[t].push_back(disk_records_[c].narrow(0, (1 + s) * n + piece.shard_offset, piece.numel).detach());
      }
    }
    if (disk_ && disk_records_[c].defined()) disk_->adopt(c, disk_records_[c], grad_shards_[c]);
  };
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    if (!params_[i].is_meta()) arrive(i, params_[i]);
  }
  if (deferred_) {
    WeightSink sink;
    sink.device = device_;
    sink.wants = [&](const std::string& name) { return chunked(name) && !has_value[index_of(name)]; };
    sink.take = [&](const std::string& name, const torch::Tensor& value) { arrive(index_of(name), value); };
    ScopedWeightSink scope(sink);
    deferred_.initialize();
  }
  for (size_t i = 0; i < names_.size(); ++i) {
    KUAFU_CHECK(has_value[i], "parameter '", names_[i], "' got no initial value: the model's initialize() left it "
                              "on the meta device");
  }
  piece_of_tensor_.assign(names_.size(), -1);
  for (const auto& item : model_.named_parameters()) {
    const auto found = std::find(names_.begin(), names_.end(), item.key());
    if (found == names_.end()) continue;
    const int64_t i = found - names_.begin();
    piece_of_tensor_[i] = static_cast<int64_t>(pieces_.size());
    chunk_of_piece_.push_back(layout_->slot(i).chunk);
    optim::Param param{item.key(), piece_masters[i], group_, true};
    param.tensor.mutable_grad() = piece_grads[i];
    pieces_.push_back(std::move(param));
  }
  if (low_precision(dtype_)) optim::cast_floating_buffers(model_, dtype_);
  optim::cast_frozen_parameters(model_, dtype_);
}

void ChunkedMasters::bind(int64_t i, const torch::Tensor& values) {
  rebind(params_[i], values.view(shapes_[i]));
  params_[i].mutable_grad() = torch::Tensor();
}

void ChunkedMasters::relocate_masters(int64_t c, const torch::Device& device, bool pinned) {
  torch::NoGradGuard no_grad;
  master_shards_[c] = copy_to(master_shards_[c], device, pinned);
  grad_shards_[c] = copy_to(grad_shards_[c], device, pinned);
  for (int64_t i : layout_->tensors_in(c)) {
    const Piece piece = layout_->piece(i, rank_);
    optim::Param& param = pieces_[piece_of_tensor_[i]];
    param.tensor.set_data(master_shards_[c].narrow(0, piece.shard_offset, piece.numel));
    param.tensor.mutable_grad() = grad_shards_[c].narrow(0, piece.shard_offset, piece.numel);
  }
}

void ChunkedMasters::watch_gradients() {
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    accumulators_.push_back(hooks::on_grad_accumulated(params_[i], [this, i] { on_grad_ready(i); }));
  }
}

torch::Tensor ChunkedMasters::zero_chunk(int64_t c) const {
  return torch::zeros({layout_->chunk_numel(c)}, torch::TensorOptions().dtype(dtype_).device(device_));
}

void ChunkedMasters::move_grad_to_staging(int64_t i, torch::Tensor& staging) {
  torch::NoGradGuard no_grad;
  const TensorSlot& slot = layout_->slot(i);
  if (!staging.defined()) staging = zero_chunk(slot.chunk);
  staging.narrow(0, slot.offset, slot.numel).copy_(params_[i].grad().reshape(-1));
  params_[i].mutable_grad() = torch::Tensor();  // the whole gradient is not kept
}

torch::Tensor ChunkedMasters::for_reduction(torch::Tensor& chunk_grads) const {
  torch::NoGradGuard no_grad;
  if (group_->trivial()) return chunk_grads;  // nothing is summed; the float32 shard widens it as it adds
  torch::Tensor wire = chunk_grads.to(grad_dtype_);  // chunk_grads itself when it has that dtype
  const double before_sum = optim::grad_average(grad_dtype_, group_->size()).before_sum;
  if (before_sum != 1.0) wire.mul_(before_sum);
  return wire;
}

void ChunkedMasters::add_reduced_grads(int64_t c, const torch::Tensor& reduced) {
  torch::NoGradGuard no_grad;
  const bool on_disk = chunk_on_disk(c);
  if (on_disk) disk_->bring_gradient(c);
  // A bf16/fp16 shard (grad_reduce = compute) is widened as it is added: on the fly on CUDA, through a
  // temporary on the CPU, as an explicit conversion would.
  grad_shards_[c].add_(reduced.to(grad_shards_[c].device()), optim::grad_average(grad_dtype_, group_->size()).after_sum);
  if (!on_disk) return;
  // The last micro-step's squares are the step's: the global norm needs no second read of the gradients.
  for (int64_t i : layout_->tensors_in(c)) {
    const Piece piece = layout_->piece(i, rank_);
    grad_squares_[i] = optim::squared_norm(grad_shards_[c].narrow(0, piece.shard_offset, piece.numel));
  }
  disk_->send_gradient(c);
}

void ChunkedMasters::use_disk_tier(DiskTierOptions options, int slots) {
  KUAFU_CHECK(master_dtype_ == torch::kFloat32, "the disk tier holds float32 masters");
  disk_ = std::make_unique<DiskMasters>(std::move(options));
  disk_slots_ = slots;
}

torch::Tensor ChunkedMasters::make_disk_record(int64_t c, const torch::Tensor& master) {
  torch::NoGradGuard no_grad;
  const int64_t n = layout_->shard_numel(c);
  // [(1 + slots) * n]: the master, then each optimizer slot (zeros, as an optimizer's state starts).
  disk_records_[c] = mapped_host_tensor((1 + disk_slots_) * n).zero_();
  disk_records_[c].narrow(0, 0, n).copy_(master);
  return disk_records_[c].narrow(0, 0, n);
}

void ChunkedMasters::take_off_disk(int64_t c) {
  if (!chunk_on_disk(c)) return;
  if (open_chunk_ == c) close_disk_chunk();
  disk_->take_back(c);
  // The record's memory now lives as long as the views of it: the master shard, the pieces, the state.
  disk_records_[c] = torch::Tensor();
  for (int64_t i : layout_->tensors_in(c)) {
    disk_state_[i].clear();
    grad_squares_[i] = torch::Tensor();
  }
}

bool ChunkedMasters::piece_on_disk(size_t piece) const { return chunk_on_disk(chunk_of_piece_.at(piece)); }

std::vector<torch::Tensor> ChunkedMasters::known_grad_squares() const {
  std::vector<torch::Tensor> known(pieces_.size());
  if (!disk_) return known;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (chunk_on_disk(layout_->slot(static_cast<int64_t>(i)).chunk) && piece_of_tensor_[i] >= 0) {
      // No gradient added since zero_grad: zeros, as the gradient is.
      known[static_cast<size_t>(piece_of_tensor_[i])] =
          grad_squares_[i].defined() ? grad_squares_[i] : torch::zeros({}, torch::kFloat64);
    }
  }
  return known;
}

std::vector<std::pair<std::string, std::vector<torch::Tensor>>> ChunkedMasters::optimizer_state_homes() const {
  std::vector<std::pair<std::string, std::vector<torch::Tensor>>> homes;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (chunk_on_disk(layout_->slot(static_cast<int64_t>(i)).chunk)) homes.emplace_back(names_[i], disk_state_[i]);
  }
  return homes;
}

void ChunkedMasters::step_masters_on_disk(const std::function<void(const std::vector<size_t>& pieces)>& step) {
  each_chunk_on_disk(/*gradients=*/true, /*changed=*/true, /*masters_changed=*/true, step);
}

void ChunkedMasters::visit_masters_on_disk(bool changed, bool masters_changed,
                                           const std::function<void(const std::vector<size_t>& pieces)>& body) {
  each_chunk_on_disk(/*gradients=*/false, changed, masters_changed, body);
}

void ChunkedMasters::each_chunk_on_disk(bool gradients, bool changed, bool masters_changed,
                                        const std::function<void(const std::vector<size_t>& pieces)>& body) {
  if (!disk_) return;
  close_disk_chunk();
  disk_->for_each(gradients, changed, [&](int64_t c) {
    std::vector<size_t> pieces;
    for (int64_t i : layout_->tensors_in(c)) pieces.push_back(static_cast<size_t>(piece_of_tensor_[i]));
    body(pieces);
    if (masters_changed) master_stepped(c);
  });
}

void ChunkedMasters::open_disk_chunk(int64_t c, bool will_change) {
  if (c != open_chunk_) {
    close_disk_chunk();
    disk_->open(c);
    open_chunk_ = c;
  }
  open_changed_ = open_changed_ || will_change;
}

void ChunkedMasters::open_disk_chunk_of(const torch::Tensor& t, bool will_change) {
  if (!masters_on_disk() || !t.defined() || !t.has_storage()) return;
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    if (disk_records_[c].defined() && disk_records_[c].storage().unsafeGetStorageImpl() == storage) {
      return open_disk_chunk(c, will_change);
    }
  }
}

void ChunkedMasters::open_disk_chunk_of(const std::string& name, bool will_change) {
  if (!masters_on_disk() || !chunked(name)) return;
  const int64_t c = layout_->slot(index_of(name)).chunk;
  if (chunk_on_disk(c)) open_disk_chunk(c, will_change);
}

void ChunkedMasters::close_disk_chunk() {
  if (open_chunk_ < 0) return;
  disk_->close(open_chunk_, open_changed_);
  open_chunk_ = -1;
  open_changed_ = false;
}

void ChunkedMasters::zero_disk_grads() {
  if (!disk_) return;
  disk_->forget_gradients();
  for (auto& square : grad_squares_) square = torch::Tensor();
}

int64_t ChunkedMasters::index_of(const std::string& name) const {
  const auto found = std::find(names_.begin(), names_.end(), name);
  KUAFU_CHECK(found != names_.end(), "no sharded parameter named '", name, "'");
  return found - names_.begin();
}

io::NamedTensors ChunkedMasters::full_state(const io::NamedTensors& piece_state) const {
  torch::NoGradGuard no_grad;
  // Slots in the order they first appear; every rank holds the same names (one piece per parameter).
  std::vector<std::string> slots;
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& [name, tensor] : piece_state) {
    const auto owner = optim::state_owner(name);
    if (!owner) continue;
    const std::string slot = name.substr(owner->size() + 1);
    if (std::find(slots.begin(), slots.end(), slot) == slots.end()) slots.push_back(slot);
    by_name[name] = tensor;
  }
  std::map<std::string, torch::Tensor> whole;
  for (const auto& slot : slots) {
    for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
      torch::Tensor shard = torch::zeros({layout_->shard_numel(c)}, master_shards_[c].options().device(group_->device()));
      for (int64_t i : layout_->tensors_in(c)) {
        const Piece piece = layout_->piece(i, rank_);
        const auto found = by_name.find(names_[i] + "/" + slot);
        KUAFU_CHECK(found != by_name.end(), "optimizer state lacks '", names_[i], "/", slot, "'");
        shard.narrow(0, piece.shard_offset, piece.numel).copy_(found->second.reshape(-1));
      }
      const torch::Tensor chunk = dist::all_gather(shard, *group_);
      for (int64_t i : layout_->tensors_in(c)) {
        whole[names_[i] + "/" + slot] = chunk.narrow(0, layout_->slot(i).offset, layout_->slot(i).numel).view(shapes_[i]);
      }
    }
  }
  io::NamedTensors out;
  for (const auto& [name, tensor] : piece_state) {
    out.emplace_back(name, optim::state_owner(name) ? whole.at(name) : tensor);
  }
  return out;
}

int64_t ChunkedMasters::piece_offset(const std::string& name) const {
  return layout_->piece(index_of(name), rank_).tensor_offset;
}

int64_t ChunkedMasters::piece_numel(const std::string& name) const {
  return layout_->piece(index_of(name), rank_).numel;
}

bool ChunkedMasters::chunked(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

io::NamedTensors ChunkedMasters::weights_to_load() const {
  std::map<std::string, torch::Tensor> shapes_only;
  for (size_t i = 0; i < names_.size(); ++i) {
    shapes_only[names_[i]] = torch::empty(shapes_[i], master_shards_.front().options().device(torch::kMeta));
  }
  return optim::weights_replacing(model_, shapes_only);
}

void ChunkedMasters::load_weight(const std::string& name, const torch::Tensor& full) {
  torch::NoGradGuard no_grad;
  const int64_t i = index_of(name);
  open_disk_chunk_of(name, /*will_change=*/true);
  const Piece piece = layout_->piece(i, rank_);
  master_shards_[layout_->slot(i).chunk]
      .narrow(0, piece.shard_offset, piece.numel)
      .copy_(full.reshape(-1).narrow(0, piece.tensor_offset, piece.numel));
  set_compute_weights(i, full);
}

torch::Tensor ChunkedMasters::piece_of(const std::string& name, const torch::Tensor& full) const {
  const int64_t i = index_of(name);
  KUAFU_CHECK(full.numel() == layout_->slot(i).numel, "saved tensor for '", name, "' has ", full.numel(),
              " elements but the parameter has ", layout_->slot(i).numel);
  const Piece piece = layout_->piece(i, rank_);
  return full.reshape(-1).narrow(0, piece.tensor_offset, piece.numel);
}

void ChunkedMasters::sum_gradient_with_copies(const std::string& name, const dist::ProcessGroup& copies) {
  torch::NoGradGuard no_grad;
  const int64_t i = index_of(name);
  const Piece piece = layout_->piece(i, rank_);
  const int64_t c = layout_->slot(i).chunk;
  torch::Tensor mine = grad_shards_[c].narrow(0, piece.shard_offset, piece.numel);  // [piece] float32
  // [numel] the whole averaged gradient: each data rank contributes its piece, zeros elsewhere.
  torch::Tensor whole = torch::zeros({layout_->slot(i).numel}, mine.options().device(params_[i].device()));
  whole.narrow(0, piece.tensor_offset, piece.numel).copy_(mine);
  if (!group_->trivial()) dist::all_reduce(whole, *group_);
  dist::all_reduce(whole, copies);
  mine.copy_(whole.narrow(0, piece.tensor_offset, piece.numel));
}

}  // namespace kuafu::memory

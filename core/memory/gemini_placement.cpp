// Gemini's placement over the fast (device) and slow (host) tiers: the static fractions, the warm-up
// trace of block calls and non-model memory, furthest-next-use eviction, prefetch and the margin that
// lets spare device memory hold master chunks. See gemini.h for the policies.
#include <algorithm>
#include <functional>
#include <limits>

#include <torch/csrc/autograd/grad_mode.h>

#include "core/memory/gemini.h"
#include "core/memory/memory_meter.h"
#include "core/util/error.h"

namespace kuafu::memory {
namespace {

// The chunks at the end of the layout whose bytes make up `fraction` of the total go to the slow tier.
std::vector<Tier> offload_tail(const std::vector<int64_t>& bytes, double fraction) {
  std::vector<Tier> tiers(bytes.size(), Tier::kFast);
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  const double wanted = fraction * static_cast<double>(total);
  int64_t offloaded = 0;
  for (size_t c = bytes.size(); c-- > 0 && static_cast<double>(offloaded) < wanted;) {
    tiers[c] = Tier::kSlow;
    offloaded += bytes[c];
  }
  return tiers;
}

}  // namespace

void Gemini::place_initially() {
  const int64_t chunks = layout_->num_chunks();
  const PlacementOptions& p = placement_;
  const bool placed = p.auto_policy || p.offload_param_fraction > 0 || p.offload_optim_fraction > 0 ||
                      p.budgets.fast_bytes > 0 || p.budgets.slow_bytes > 0;
  KUAFU_CHECK(!placed || low_precision(dtype_),
              "Gemini placement needs a bf16 or fp16 compute dtype: in float32 the compute shards are the masters");
  KUAFU_CHECK(p.offload_param_fraction >= 0 && p.offload_param_fraction <= 1 && p.offload_optim_fraction >= 0 &&
                  p.offload_optim_fraction <= 1 && p.margin_ratio >= 0 && p.margin_ratio <= 1,
              "Gemini placement fractions must lie in [0, 1]");
  if (p.auto_policy) {
    // Everything starts in host memory; warm-up shows what the device can hold besides the activations.
    shard_tier_.assign(chunks, Tier::kSlow);
    master_tier_.assign(chunks, Tier::kSlow);
    return;
  }
  std::vector<int64_t> bytes;
  for (int64_t c = 0; c < chunks; ++c) bytes.push_back(layout_->chunk_numel(c));
  shard_tier_ = offload_tail(bytes, p.offload_param_fraction);
  master_tier_ = offload_tail(bytes, p.offload_optim_fraction);
}

torch::Device Gemini::tier_device(Tier tier) const { return tier == Tier::kFast ? fast_device_ : torch::kCPU; }

torch::Tensor Gemini::copy_to_tier(const torch::Tensor& t, Tier tier) const {
  return copy_to(t, tier_device(tier), tier == Tier::kSlow && fast_device_.is_cuda());
}

bool Gemini::tracks_memory() const { return placement_.auto_policy || placement_.budgets.fast_bytes > 0; }

bool Gemini::keeps_chunks() const { return placement_.auto_policy && warmed_up_; }

int64_t Gemini::payload_bytes(int64_t c) const {
  return layout_->chunk_numel(c) * static_cast<int64_t>(torch::elementSize(dtype_));
}

int64_t Gemini::shard_bytes(int64_t c) const {
  return layout_->shard_numel(c) * static_cast<int64_t>(torch::elementSize(dtype_));
}

int64_t Gemini::master_bytes(int64_t c) const {
  // Master, gradient shard and optimizer state, float32 each; in float32 training the master is the
  // compute shard, counted already.
  const int64_t tensors = (low_precision(dtype_) ? 2 : 1) + optimizer_slots_;
  return layout_->shard_numel(c) * static_cast<int64_t>(torch::elementSize(master_dtype_)) * tensors;
}

int64_t Gemini::disk_staging_bytes() const {
  if (!disk_) return 0;
  // Any DiskMasters::kChunksAtOnce chunks may be in memory together: the largest that many bound them (a
  // tensor above the chunk-size search has a chunk of its own, larger than the rest).
  std::vector<int64_t> shards;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) shards.push_back(layout_->shard_numel(c));
  const auto at_once = std::min<std::ptrdiff_t>(DiskMasters::kChunksAtOnce, static_cast<std::ptrdiff_t>(shards.size()));
  std::partial_sort(shards.begin(), shards.begin() + at_once, shards.end(), std::greater<>());
  int64_t elements = 0;
  for (std::ptrdiff_t i = 0; i < at_once; ++i) elements += shards[static_cast<size_t>(i)];
  const int64_t element = static_cast<int64_t>(torch::elementSize(master_dtype_));
  return ((1 + optimizer_slots_) + 1) * elements * element;  // each chunk's record (master, slots) and gradient
}

void Gemini::account_optimizer_state(int slots) {
  if (state_counted_) {
    // Counted from the start (GeminiOptions::optimizer_slots), and the disk's records are sized by it.
    KUAFU_CHECK(slots == optimizer_slots_, "Gemini's disk tier was sized for ", optimizer_slots_,
                " optimizer state tensors per element, and the optimizer keeps ", slots);
    return;
  }
  KUAFU_CHECK(optimizer_slots_ == 0 && slots >= 0, "Gemini: optimizer state accounted twice");
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) ledger_.remove(master_tier_[c], master_bytes(c));
  optimizer_slots_ = slots;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    // Under auto, master chunks whose state host memory cannot hold are stepped on the device.
    Tier tier = master_tier_[c];
    if (placement_.auto_policy && tier == Tier::kSlow && !ledger_.fits(Tier::kSlow, master_bytes(c))) tier = Tier::kFast;
    ledger_.add(tier, master_bytes(c), detail::concat("the masters and optimizer state of chunk ", c));
    if (tier != master_tier_[c]) {
      relocate_masters(c, tier_device(tier), /*pinned=*/false);
      master_tier_[c] = tier;
    }
  }
}

void Gemini::make_room(int64_t bytes, const std::vector<int64_t>& keep) {
  if (!keeps_chunks()) return;  // otherwise nothing is kept that could go
  while (!ledger_.fits(Tier::kFast, bytes)) {
    std::vector<int64_t> candidates;
    for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
      if (gathered_[c] && !pinned_[c] && idle(c) && std::find(keep.begin(), keep.end(), c) == keep.end()) {
        candidates.push_back(c);
      }
    }
    if (candidates.empty()) return;  // the ledger's error names what did not fit
    release(furthest_next_use(candidates, trace_, call_ >= 0 ? call_start_[call_] : 0));
    ++evictions_;
  }
}

void Gemini::begin_call(const hooks::BlockCall& call, bool backward, const std::vector<int64_t>& chunks) {
  in_use_chunks_ = chunks;
  if (!tracks_memory()) return;
  // A forward without gradient (a recycling iteration before the last, evaluation) keeps no activations
  // for backward: it is traced apart, so that a step with another number of them still finds each call's
  // own figures (the trained forward's calls are the same in every step).
  const bool tracked_forward = !backward && torch::GradMode::is_enabled();
  const std::string key = call.name + (backward ? "/bwd" : tracked_forward ? "/fwd" : "/fwd-no-grad");
  call_ = -1;
  if (tracing_) {
    call_keys_.push_back(key);
    call_chunks_.push_back(chunks);
    call_non_model_.push_back(0);
    call_ = static_cast<int64_t>(call_keys_.size()) - 1;
  } else if (warmed_up_) {
    // Where this call sits in the traced micro-step, searched from where the last one was; a forward
    // without gradient that the trace never saw (evaluation) takes its traced forward's place.
    const int64_t calls = static_cast<int64_t>(call_keys_.size());
    const auto find = [&](const std::string& wanted) {
      for (int64_t k = 0; k < calls; ++k) {
        const int64_t t = (next_call_ + k) % calls;
        if (call_keys_[t] == wanted) return t;
      }
      return int64_t{-1};
    };
    call_ = find(key);
    if (call_ < 0 && !backward && !tracked_forward) call_ = find(call.name + "/fwd");
    if (call_ >= 0) next_call_ = call_ + 1;
  }
  sample_non_model();
}

void Gemini::end_call() {
  in_use_chunks_.clear();
  if (keeps_chunks()) prefetch_next_call();
}

void Gemini::sample_non_model() {
  if (!tracks_memory()) return;
  int64_t non_model = 0;
  if (warmed_up_) {
    non_model = call_ >= 0 ? call_non_model_[call_] : 0;
  } else {
    non_model = measured_non_model();
    if (tracing_ && call_ >= 0) call_non_model_[call_] = std::max(call_non_model_[call_], non_model);
  }
  // Room first (the traced activations are yet to come), then the activations enter the ledger.
  make_room(std::max<int64_t>(0, non_model - ledger_.non_model_bytes()), in_use_chunks_);
  ledger_.set_non_model(non_model);
  ledger_.add(Tier::kFast, 0, call_ >= 0 ? "the activations of block call '" + call_keys_[call_] + "'"
                                         : std::string("the activations"));
}

int64_t Gemini::model_bytes_in_use_counts() const {
  // On the CPU both tiers share the heap, so both count as model data there.
  return ledger_.model_bytes(Tier::kFast) + (fast_device_.is_cpu() ? ledger_.model_bytes(Tier::kSlow) : 0);
}

int64_t Gemini::measured_non_model() {
  // What the device holds beyond the model data the ledger knows of, relative to the first sample.
  const int64_t model = model_bytes_in_use_counts();
  int64_t outside_model = bytes_in_use(fast_device_) - model;
  if (!non_model_base_) non_model_base_ = outside_model;
  if (compute_model_bytes_) {
    // After a block computed: its peak (temporaries freed inside the block included), less the most
    // model data it held meanwhile (its gradient buffers arrive during backward).
    outside_model = std::max(outside_model, compute_peak_->peak() - std::max(*compute_model_bytes_, model));
    compute_model_bytes_.reset();
  }
  int64_t non_model = std::max<int64_t>(0, outside_model - *non_model_base_);
  if (tracing_ && !group_->trivial()) {
    // The largest over the ranks: every rank then traces the same calls alike and keeps and evicts the
    // same chunks (gathering is collective), and a budget that cannot hold it stops every rank here.
    torch::Tensor largest = torch::tensor({non_model}, torch::TensorOptions(torch::kInt64).device(group_->device()));
    dist::all_reduce(largest, *group_, dist::Reduce::kMax);
    non_model = largest.item<int64_t>();
  }
  return non_model;
}

void Gemini::finish_warm_up() {
  warmed_up_ = true;
  tracing_ = false;
  if (!tracks_memory()) return;
  std::vector<int64_t> accesses;
  for (const auto& chunks : call_chunks_) {
    call_start_.push_back(static_cast<int64_t>(accesses.size()));
    accesses.insert(accesses.end(), chunks.begin(), chunks.end());
  }
  trace_ = AccessTrace(accesses);
  call_ = -1;
  ledger_.set_non_model(0);
  if (placement_.auto_policy) place_masters_in_margin();
}

void Gemini::place_masters_in_margin() {
  if (placement_.margin_ratio <= 0) return;
  // The most the blocks need at once: non-model memory plus the chunks a call computes with (and, in
  // backward, their gradients).
  int64_t need = 0;
  for (size_t t = 0; t < call_keys_.size(); ++t) {
    const bool backward = call_keys_[t].size() > 4 && call_keys_[t].compare(call_keys_[t].size() - 4, 4, "/bwd") == 0;
    int64_t chunk_bytes = 0;
    for (int64_t c : call_chunks_[t]) chunk_bytes += payload_bytes(c) * (backward ? 2 : 1);
    need = std::max(need, call_non_model_[t] + chunk_bytes);
  }
  const int64_t budget = ledger_.budget(Tier::kFast);
  const double spare = budget == 0 ? std::numeric_limits<double>::infinity()
                                   : static_cast<double>(budget - ledger_.model_bytes(Tier::kFast) - need);
  double room = placement_.margin_ratio * spare;
  // Master chunks on the disk first: each costs the disk a read and a write of its record every step (and
  // of its gradient every micro-step); then those in host memory, which CPU Adam steps.
  for (int64_t c : disk_chunks_by_last_use()) {
    if (static_cast<double>(master_bytes(c)) > room) continue;
    take_masters_off_disk(c, Tier::kFast);
    room -= static_cast<double>(master_bytes(c));
  }
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    if (master_tier_[c] == Tier::kSlow && !chunk_on_disk(c) && static_cast<double>(master_bytes(c)) <= room) {
      move_masters(c, Tier::kFast);
      room -= static_cast<double>(master_bytes(c));
    }
  }
}

std::vector<int64_t> Gemini::disk_chunks_by_last_use() const {
  // [chunk] the warm-up trace's last call that used it (backward's last reductions come last).
  std::vector<int64_t> last_use(layout_->num_chunks(), -1);
  for (size_t t = 0; t < call_chunks_.size(); ++t) {
    for (int64_t c : call_chunks_[t]) last_use[c] = static_cast<int64_t>(t);
  }
  std::vector<int64_t> order;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    if (chunk_on_disk(c)) order.push_back(c);
  }
  // The gradients the backward reduces last have the least compute left to hide their writes behind.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return last_use[a] > last_use[b]; });
  return order;
}

void Gemini::take_masters_off_disk(int64_t c, Tier to) {
  if (disk_->chunks() == 1) ledger_.remove(Tier::kSlow, disk_staging_bytes());  // the tier's buffers go with its last chunk
  ledger_.add(to, master_bytes(c), detail::concat("the masters of chunk ", c));
  take_off_disk(c);  // into host memory, where its optimizer state stays until the optimizer's next step moves it
  master_tier_[c] = to;
  if (tier_device(to) != torch::Device(torch::kCPU)) relocate_masters(c, tier_device(to), /*pinned=*/false);
}

void Gemini::move_masters(int64_t c, Tier to) {
  if (master_tier_[c] == to) return;
  ledger_.add(to, master_bytes(c), detail::concat("the masters of chunk ", c));
  ledger_.remove(master_tier_[c], master_bytes(c));
  relocate_masters(c, tier_device(to), to == Tier::kSlow && fast_device_.is_cuda());
  master_tier_[c] = to;
}

void Gemini::prefetch_next_call() {
  if (call_ < 0 || call_keys_.empty()) return;
  const int64_t next = (call_ + 1) % static_cast<int64_t>(call_keys_.size());
  int64_t bytes = 0;
  for (int64_t c : call_chunks_[next]) bytes += gathered_[c] ? 0 : payload_bytes(c);
  if (bytes == 0) return;
  // Only into free room, leaving what the next call's activations will need: a prefetch never evicts.
  const int64_t growth = std::max<int64_t>(0, call_non_model_[next] - call_non_model_[call_]);
  if (!ledger_.fits(Tier::kFast, bytes + growth)) return;
  for (int64_t c : call_chunks_[next]) {
    if (!gathered_[c]) {
      arriving_[c] = prefetch_stream_.run([&] { gather(c); });
      ++prefetches_;
    }
  }
}

void Gemini::take_arrival(int64_t c) {
  if (!arriving_[c]) return;
  SideStream::hand_over(arriving_[c], payloads_[c]);
  arriving_[c].reset();
}

int64_t Gemini::fast_bytes_held() const {
  int64_t bytes = 0;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    if (gathered_[c]) bytes += static_cast<int64_t>(payloads_[c].storage().nbytes());
    if (!pinned_[c] && shard_tier_[c] == Tier::kFast) bytes += shards_[c].numel() * shards_[c].element_size();
    if (grad_staging_[c].defined()) bytes += grad_staging_[c].numel() * grad_staging_[c].element_size();
    if (master_tier_[c] == Tier::kFast) {
      const int64_t master = master_shards_[c].numel() * master_shards_[c].element_size();
      bytes += (low_precision(dtype_) ? master : 0) + master * (1 + optimizer_slots_);  // + gradient and state
    }
  }
  return bytes;
}

std::string Gemini::describe() const {
  int64_t slow_shards = 0, slow_masters = 0;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    slow_shards += shard_tier_[c] == Tier::kSlow;
    slow_masters += master_tier_[c] == Tier::kSlow && !chunk_on_disk(c);
  }
  const std::string on_disk =
      disk_ ? detail::concat(", ", disk_->chunks(), " on the disk tier (", disk_->disk().folder(), ")") : std::string();
  const auto budget = [](int64_t bytes) { return bytes == 0 ? std::string("unlimited") : mib(bytes); };
  return detail::concat("Gemini (ZeRO-3 chunks): ", layout_->num_chunks(), " chunks of up to ",
                        layout_->largest_chunk_numel(), " elements over ", group_->size(), " ranks; placement ",
                        placement_.auto_policy ? "auto" : "static", ", ", slow_shards, " compute shards and ",
                        slow_masters, " master chunks in host memory", on_disk, "; budgets: device ",
                        budget(ledger_.budget(Tier::kFast)), ", host ", budget(ledger_.budget(Tier::kSlow)));
}

std::vector<std::pair<std::string, double>> Gemini::memory_figures() const {
  int64_t fast_masters = 0, slow_masters = 0;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) {
    fast_masters += master_tier_[c] == Tier::kFast;
    slow_masters += master_tier_[c] == Tier::kSlow && !chunk_on_disk(c);
  }
  int64_t chunk_bytes = 0;
  for (int64_t c = 0; c < layout_->num_chunks(); ++c) chunk_bytes += payload_bytes(c);
  const auto in_mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  std::vector<std::pair<std::string, double>> figures = {{"chunks_mb", in_mib(chunk_bytes)},
          {"device_peak_mb", in_mib(ledger_.peak_bytes(Tier::kFast))},
          {"activations_peak_mb", in_mib(ledger_.peak_non_model_bytes())},
          {"host_peak_mb", in_mib(ledger_.peak_bytes(Tier::kSlow))},
          {"evictions", static_cast<double>(evictions_)},
          {"prefetches", static_cast<double>(prefetches_)},
          {"master_chunks_on_device", static_cast<double>(fast_masters)},
          {"master_chunks_on_host", static_cast<double>(slow_masters)}};
  if (disk_) {
    const DiskTier::Totals io = disk_->disk().totals();
    const std::vector<std::pair<std::string, double>> disk = {
        {"master_chunks_on_disk", static_cast<double>(disk_->chunks())},
        {"disk_peak_mb", in_mib(disk_->disk().peak_bytes())},
        {"disk_staging_peak_mb", in_mib(disk_->peak_host_bytes())},
        {"disk_read_gb", static_cast<double>(io.bytes_read) / (1 << 30)},
        {"disk_written_gb", static_cast<double>(io.bytes_written) / (1 << 30)},
        // The I/O threads' time reading and writing, and the training thread's waiting for them: the rest of
        // the disk's time was hidden behind the step's compute.
        {"disk_read_s", io.read_seconds},
        {"disk_write_s", io.write_seconds},
        {"disk_wait_s", disk_->wait_seconds()}};
    figures.insert(figures.end(), disk.begin(), disk.end());
  }
  return figures;
}

}  // namespace kuafu::memory

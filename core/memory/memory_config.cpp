#include "core/memory/memory_config.h"

#include "core/memory/disk_masters.h"
#include "core/memory/gemini.h"
#include "core/memory/zero.h"

namespace kuafu::memory {

void add_memory_schema(config::Schema& s) {
  s.add_string("memory.strategy", "none",
               "none: every data rank holds the whole model states; zero1: optimizer state and float32 masters "
               "sharded over the data ranks; zero2: gradients too; gemini: parameters too, in chunks gathered "
               "around each block (ZeRO-3)")
      .choices({"none", "zero1", "zero2", "gemini"});
  s.add_float("memory.chunk_mb", 0.0,
              "chunk size in MiB of the compute dtype (the unit ZeRO reduces and gathers); 0: the size that wastes least up to "
              "64 MiB and an eighth of the model (or twice its largest tensor)")
      .min(0.0);
  s.add_string("memory.placement", "static",
               "gemini: static keeps fixed fractions of the chunks in host memory (offload_*_fraction); auto learns "
               "the activations' memory in the first micro-step, keeps chunks on the device while they fit, evicts "
               "the one used furthest ahead and prefetches the next block's")
      .choices({"static", "auto"});
  s.add_float("memory.device_budget_mb", 0.0,
              "gemini: MiB of device memory for chunks plus activations (0: unlimited); on the CPU the budget is "
              "enforced by accounting, as the capacity of the fast tier")
      .min(0.0);
  s.add_float("memory.host_budget_mb", 0.0, "gemini: MiB of host memory for chunks (0: unlimited)").min(0.0);
  s.add_float("memory.offload_param_fraction", 0.0,
              "gemini, static placement: share of the compute-dtype weights kept in host memory")
      .min(0.0)
      .max(1.0);
  s.add_float("memory.offload_optim_fraction", 0.0,
              "gemini, static placement: share of the float32 masters, gradients and optimizer state kept in host "
              "memory (stepped there by CPU Adam)")
      .min(0.0)
      .max(1.0);
  s.add_bool("memory.offload_frozen", false,
             "frozen weights (a LoRA base) live in host memory and come to the device one block at a time; needs "
             "memory.activation_checkpointing and memory.strategy = \"none\"");
  s.add_string("memory.disk_dir", "",
               "a folder on a local disk for the disk tier (issue 55): under memory.offload_frozen frozen weights (PPO's "
               "reference and reward models, a LoRA base) live in files there instead of host memory and are read "
               "one block at a time; under memory.strategy = \"gemini\" the master chunks (float32 masters, gradients, "
               "optimizer state) that memory.host_budget_mb cannot hold live there, stepped a chunk at a time; each run makes its own scratch folder inside it and removes it at the end (never "
               "read by a resume); empty: no disk tier");
  s.add_bool("memory.disk_read_ahead", true,
             "read the next block's chunks from the disk tier while the current block computes (off: when it is called)");
  s.add_float("memory.disk_budget_gb", 0.0, "GiB the disk tier's files may take in memory.disk_dir (0: unlimited)").min(0.0);
  s.add_float("memory.margin_ratio", 0.0,
              "gemini, auto placement: share of the device memory left spare after warm-up that holds float32 "
              "masters and optimizer state (stepped on the device), taken first from the disk tier's chunks")
      .min(0.0)
      .max(1.0);
}

namespace {

// Placement keys are Gemini's, each for one policy, and need separate float32 masters.
PlacementOptions placement_options(const config::Config& config, const std::string& strategy, torch::Dtype dtype) {
  PlacementOptions p;
  p.auto_policy = config.get_string("memory.placement") == "auto";
  p.offload_param_fraction = config.get_float("memory.offload_param_fraction");
  p.offload_optim_fraction = config.get_float("memory.offload_optim_fraction");
  p.margin_ratio = config.get_float("memory.margin_ratio");
  p.budgets.fast_bytes = static_cast<int64_t>(config.get_float("memory.device_budget_mb") * (1 << 20));
  p.budgets.slow_bytes = static_cast<int64_t>(config.get_float("memory.host_budget_mb") * (1 << 20));
  const std::vector<std::pair<std::string, bool>> set = {
      {"memory.placement", p.auto_policy},
      {"memory.device_budget_mb", p.budgets.fast_bytes > 0},
      {"memory.host_budget_mb", p.budgets.slow_bytes > 0},
      {"memory.offload_param_fraction", p.offload_param_fraction > 0},
      {"memory.offload_optim_fraction", p.offload_optim_fraction > 0},
      {"memory.margin_ratio", p.margin_ratio > 0}};
  for (const auto& [key, used] : set) {
    if (!used) continue;
    if (strategy != "gemini") config.fail_at(key, "places Gemini's chunks: it needs memory.strategy = \"gemini\"");
    if (!low_precision(dtype)) {
      config.fail_at(key, "needs precision.dtype = \"bf16\" or \"fp16\": in float32 the compute chunks are the "
                          "masters, so there is nothing separate to place");
    }
  }
  if (p.auto_policy) {
    for (const char* key : {"memory.offload_param_fraction", "memory.offload_optim_fraction"}) {
      if (config.get_float(key) > 0) config.fail_at(key, "applies to memory.placement = \"static\"; auto decides itself");
    }
  } else if (p.margin_ratio > 0) {
    config.fail_at("memory.margin_ratio", "applies to memory.placement = \"auto\"");
  }
  return p;
}

// Under a host budget, the disk tier's buffers (DiskMasters::most_host_bytes for the largest chunk's shard)
// take at most 1/kDiskBuffersShare of it: the search's own bound, 64 MiB chunks, once spent 1.5 of a 2 GiB
// budget on them and left the compute shards a quarter (a ViT-B/32 stopped at 38 layers). A tensor above the
// bound (OPT's embedding) takes a chunk of its own and only its own buffers exceed it. 0: no bound.
constexpr int64_t kDiskBuffersShare = 8;

int64_t disk_chunk_search_max(int64_t host_budget_bytes, int optimizer_slots, int ranks) {
  if (host_budget_bytes <= 0) return 0;
  const int64_t element = static_cast<int64_t>(sizeof(float));
  const int64_t buffers_per_element = DiskMasters::most_host_bytes((1 + optimizer_slots) * element, element);
  return std::max<int64_t>(1, host_budget_bytes / kDiskBuffersShare / buffers_per_element) * ranks;
}

}  // namespace

std::unique_ptr<ChunkedMasters> make_sharded_states(const config::Config& config, const std::string& strategy,
                                                    torch::nn::Module& model, const dist::GroupPtr& group,
                                                    torch::Dtype compute_dtype, bool whole_gradients,
                                                    DeferredWeights deferred, std::optional<DiskTierOptions> disk,
                                                    int optimizer_slots) {
  const PlacementOptions placement = placement_options(config, strategy, compute_dtype);
  if (strategy == "none") return nullptr;
  const int64_t chunk_numel =
      static_cast<int64_t>(config.get_float("memory.chunk_mb") * (1 << 20)) / torch::elementSize(compute_dtype);
  const optim::GradReduce grad_reduce = optim::grad_reduce(config);
  if (strategy == "gemini") {
    if (disk && !low_precision(compute_dtype)) {
      config.fail_at("memory.disk_dir", "holds Gemini's float32 masters apart from the compute weights: it needs "
                                        "precision.dtype = \"bf16\" or \"fp16\"");
    }
    const int64_t search_max = disk ? disk_chunk_search_max(placement.budgets.slow_bytes, optimizer_slots, group->size()) : 0;
    return std::make_unique<Gemini>(model, group,
                                    GeminiOptions{chunk_numel, compute_dtype, placement, grad_reduce, std::move(deferred),
                                                  std::move(disk), optimizer_slots, search_max});
  }
  KUAFU_CHECK(!disk, "memory.disk_dir holds master chunks under memory.strategy = \"gemini\" only");
  return std::make_unique<ZeroRedundancy>(model, group,
                                          ZeroOptions{strategy == "zero1" || whole_gradients ? 1 : 2, chunk_numel,
                                                      compute_dtype, grad_reduce, std::move(deferred)});
}

}  // namespace kuafu::memory

#include "core/train/hf_interop.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "core/train/checkpoint.h"
#include "core/train/piece_reader.h"
#include "core/util/error.h"
#include "core/util/logging.h"
#include "core/util/text.h"
#include "core/util/weight_sink.h"

namespace kuafu::train {

void add_hf_schema(config::Schema& s) {
  s.add_string("model.init_from", "",
               "a Hugging Face model folder (config.json + safetensors) to start from: its config gives the "
               "model's shape, its weights the initial ones (a resumed run takes its checkpoint's)");
  s.add_float("export.max_shard_mb", 5120, "`export` cuts the weights into files of at most this size").min(1);
}

std::string init_from(const config::Config& config) {
  const std::string dir = config.get_string("model.init_from");
  if (!dir.empty() && !std::filesystem::exists(std::filesystem::path(dir) / "config.json")) {
    config.fail_at("model.init_from", "= " + dir + " is not a Hugging Face model folder (no config.json there)");
  }
  return dir;
}

io::HfWriteOptions export_options(const config::Config& config) {
  io::HfWriteOptions options;
  // An app whose export is not a sharded folder (kuafu-fold writes one .npz) declares no export keys.
  if (!config.schema().find("export.max_shard_mb")) return options;
  options.max_shard_bytes = static_cast<int64_t>(config.get_float("export.max_shard_mb") * (1 << 20));
  return options;
}

namespace {

bool starts_with_any(const std::string& name, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return text::starts_with(name, p); });
}

// A tied head stored as a copy must equal the embedding the model keeps, or the copy the model drops
// would differ from what it computes with.
void check_tied_copy(const io::HfFolder& folder, const HfWeightNames& names) {
  const io::HfTensor* copy = folder.find(names.tied_head);
  if (!copy) return;
  const std::string bare = names.tied_embedding.substr(names.prefix.size());
  const io::HfTensor* embedding = folder.find(names.tied_embedding);
  if (!embedding) embedding = folder.find(bare);
  KUAFU_CHECK(embedding && torch::equal(copy->read(), embedding->read()), copy->file, ": ", names.tied_head,
              " differs from ", names.tied_embedding, "; the model ties them");
}

}  // namespace

void load_pretrained(torch::nn::Module& model, const parallel::TensorParallel& tp, const io::HfFolder& folder,
                     const HfWeightNames& names) {
  const io::StoredToModel to_model = [&](const std::string& stored) -> std::optional<std::string> {
    if (stored == names.tied_head || starts_with_any(stored, names.fresh_prefixes)) return std::nullopt;
    const bool own = starts_with_any(stored, names.own_prefixes) || text::starts_with(stored, names.prefix);
    const std::string name = own ? stored : names.prefix + stored;  // a bare base model's names lack the prefix
    const bool dropped = starts_with_any(name, names.dropped_prefixes) ||
                         std::any_of(names.dropped_suffixes.begin(), names.dropped_suffixes.end(),
                                     [&](const std::string& s) { return text::ends_with(name, s); });
    if (dropped) return std::nullopt;
    return name;
  };
  const io::MayStay may_stay = [&](const std::string& name) { return starts_with_any(name, names.fresh_prefixes); };
  // Each stored tensor is read alone and goes straight into the parameter: whole, or under tensor
  // parallelism only this rank's block of it (its bytes alone read from the file). A parameter still on
  // the meta device (lazy construction) goes to the weight sink in scope when it wants it; otherwise
  // (another pipeline stage's) it is checked against the folder but not read.
  const WeightSink* sink = current_weight_sink();
  const auto layouts = parallel::collect_layouts(model);
  io::HfTargets targets;
  for (auto& item : model.named_parameters()) {
    torch::Tensor p = item.value();
    const auto layout = layouts.find(item.key());
    io::HfTarget& target = targets[item.key()];
    target.dtype = p.scalar_type();
    if (layout == layouts.end()) {
      target.shape = p.sizes().vec();
    } else {
      target.shape = parallel::full_shape(p.sizes(), layout->second, *tp.mesh);
    }
    std::function<void(const torch::Tensor&)> put;
    if (!p.is_meta()) {
      put = [p](const torch::Tensor& value) mutable { p.copy_(value); };
    } else if (sink && sink->wants(item.key())) {
      put = [sink, name = item.key()](const torch::Tensor& value) { sink->take(name, value); };
    } else {
      continue;
    }
    target.fill = put;
    if (layout != layouts.end()) {  // this rank's block alone is read
      target.read = [cuts = parallel::block_cuts(layout->second, *tp.mesh)](const io::HfTensor& stored) {
        return read_block(*stored.index, *stored.entry, cuts);
      };
    }
  }
  const uint64_t read_before = io::tensor_bytes_read();
  io::load_hf_weights(folder, targets, to_model, may_stay);
  uint64_t stored = 0;
  for (const io::HfTensor& t : folder.tensors) stored += t.entry->end - t.entry->begin;
  log::infof(folder.path, ": read ", (io::tensor_bytes_read() - read_before) >> 20, " MiB of its ", stored >> 20,
             " MiB of weights (this rank's part)");
  if (!names.tied_head.empty()) check_tied_copy(folder, names);
}

void export_pretrained(const torch::nn::Module& model, const parallel::TensorParallel& tp, const std::string& dir,
                       const nlohmann::json& config, const io::HfWriteOptions& options) {
  KUAFU_CHECK(!tp.enabled(), "export takes the whole (serial) model");
  io::NamedTensors tensors;
  for (const auto& [name, tensor] : named_weights(model)) tensors.emplace_back(name, tensor.detach().to(torch::kFloat32));
  io::write_hf_folder(dir, config, tensors, options);
}

}  // namespace kuafu::train

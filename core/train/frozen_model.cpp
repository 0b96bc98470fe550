#include "core/train/frozen_model.h"

#include "core/memory/frozen_offload.h"
#include "core/optim/mixed_precision.h"
#include "core/train/held_model.h"
#include "core/util/error.h"
#include "core/util/logging.h"

namespace kuafu::train {

FrozenModel::FrozenModel(const config::Config& config, const Runtime& runtime, torch::nn::Module& model,
                         FrozenModelOptions options)
    : model_(model), options_(std::move(options)), dtype_(train::compute_dtype(config, runtime.device)) {
  const bool offload = held_model(config).offload_frozen;
  for (const auto& item : model.named_parameters()) {
    const torch::Device& device = item.value().device();
    KUAFU_CHECK(device == runtime.device || (offload && device.is_cpu()), "frozen model ", options_.name, ": parameter ",
                item.key(), " is on ", device.str(), ", not on the run's device ", runtime.device.str());
    item.value().requires_grad_(false);
  }
  optim::cast_frozen_parameters(model, dtype_);
  optim::cast_floating_buffers(model, dtype_);
  if (offload) {
    // Its forward keeps no graph (nothing of it is trained), so no block's weights stay for a backward.
    offload_ = std::make_unique<memory::FrozenWeightOffload>(model, runtime.device, disk_tier_options(config));
    hooks_installed_ = options_.set_block_hooks && options_.set_block_hooks(offload_.get());
    if (!hooks_installed_) {
      config.fail_at("memory.offload_frozen", "needs a model that runs its blocks through the block-call interface "
                                              "(frozen model \"" + options_.name + "\")");
    }
    if (runtime.is_main()) log::infof("frozen model ", options_.name, ": ", offload_->describe());
  }
}

torch::Dtype FrozenModel::dtype_of(const config::Config& config, const std::string& name, const torch::Device& device) {
  return train::compute_dtype(config, device, name);
}

Materialization FrozenModel::materialization_of(const config::Config& config, const std::string& name,
                                                const torch::Device& device) {
  Materialization how = Materialization::all_in(device, dtype_of(config, name, device));
  if (held_model(config, name).offload_frozen) how.on_host = [](const std::string&) { return true; };
  return how;
}

void freeze(torch::nn::Module& model) {
  model.eval();
  for (auto& p : model.parameters()) p.set_requires_grad(false);
}

int64_t FrozenModel::host_bytes() const { return offload_ ? offload_->host_bytes() : 0; }

int64_t FrozenModel::disk_bytes() const { return offload_ ? offload_->disk_bytes() : 0; }

FrozenModel::~FrozenModel() {
  if (hooks_installed_) options_.set_block_hooks(nullptr);
  offload_.reset();  // the weights return to the device
}

std::vector<CheckpointPart> FrozenModel::checkpoint_parts() const {
  if (!options_.saved) return {};
  // Weights whose home is the disk are read back for the checkpoint (a host copy while it is written).
  io::NamedTensors weights = named_weights(model_);
  if (offload_) weights = offload_->with_values_from_disk(std::move(weights));
  return {{options_.name, std::move(weights), {}, ""}};
}

void FrozenModel::load(const std::string& folder) {
  if (!options_.saved) return;
  io::NamedTensors weights = named_weights(model_);
  if (offload_) weights = offload_->with_values_from_disk(std::move(weights));  // host copies to load into
  CheckpointStore::load_weights(folder, weights, nullptr, options_.name);
  if (offload_) offload_->write_values_to_disk(weights);
}

}  // namespace kuafu::train

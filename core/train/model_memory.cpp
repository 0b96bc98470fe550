#include "core/train/model_memory.h"

#include <sstream>
#include <vector>

#include "core/memory/memory_meter.h"
#include "core/optim/mixed_precision.h"
#include "core/optim/optim_config.h"
#include "core/train/frozen_model.h"
#include "core/train/held_model.h"
#include "core/util/error.h"

namespace kuafu::train {
namespace {

std::string gib(double bytes) {
  std::ostringstream out;
  out.precision(3);
  out << bytes / (1024.0 * 1024 * 1024) << " GiB";
  return out.str();
}

std::string number_text(double n) {
  std::ostringstream out;
  out.precision(4);
  out << n;
  return out.str();
}

// The keys that say the model's size, as the config set them (model.shape names a string): those set,
// or every one when none is (the shape came from model.init_from's folder or the defaults).
std::string keys_text(const config::Config& config, const std::vector<std::string>& model_keys) {
  std::vector<std::string> shown;
  for (const std::string& key : model_keys) {
    if (config.is_set(key)) shown.push_back(key);
  }
  if (shown.empty()) shown = model_keys;
  std::ostringstream keys;
  for (size_t i = 0; i < shown.size(); ++i) {
    const config::Field* field = config.schema().find(shown[i]);
    keys << (i ? ", " : "") << shown[i] << " = ";
    if (field && field->type() == config::Type::kString) {
      keys << '"' << config.get_string(shown[i]) << '"';
    } else if (field && field->type() == config::Type::kFloat) {
      keys << config.get_float(shown[i]);
    } else {
      keys << config.get_int(shown[i]);
    }
  }
  return keys.str();
}

// What the host (and `device`, when it is a GPU) can still allocate.
double available_on(const torch::Device& device) {
  double available = static_cast<double>(memory::available_bytes(torch::kCPU));
  if (device.is_cuda()) available += static_cast<double>(memory::available_bytes(device));
  return available;
}

}  // namespace

double least_training_bytes(const config::Config& config, const Runtime& runtime, double parameters, double frozen) {
  const double model_ranks = static_cast<double>(runtime.tensor.size()) * runtime.pipeline.stages;
  const double share = (parameters - frozen) / model_ranks;
  const double data = runtime.mesh->size("data");
  const torch::Dtype dtype = compute_dtype(config, runtime.device);
  const double compute = static_cast<double>(torch::elementSize(dtype));
  const double masters = dtype == torch::kFloat32 ? 0 : 4;  // float32 masters beside low-precision weights
  // Float32 tensors beside each master: the optimizer's state and the moving average of the weights.
  const double state = 4.0 * (optim::state_slots(config) + (config.get_float("optim.ema_decay") > 0 ? 1 : 0));
  // Whole gradients are float32 main gradients under bf16/fp16 unless precision.grad_reduce = "compute".
  const double grads = static_cast<double>(torch::elementSize(optim::grad_dtype(dtype, optim::grad_reduce(config))));
  const std::string& strategy = held_model(config).strategy;
  double per_parameter = compute + grads + masters + state;  // weights, gradients, masters, optimizer
  if (strategy == "zero1") per_parameter = compute + grads + (masters + state) / data;
  if (strategy == "zero2") per_parameter = compute + (compute + masters + state) / data;
  if (strategy == "gemini") per_parameter = (compute + compute + 4 + state) / data;
  // Gemini's disk tier (memory.disk_dir) can hold every master chunk: only the compute shards must be in memory.
  if (strategy == "gemini" && !held_model(config).disk_dir.empty() && masters > 0) per_parameter = compute / data;
  return share * per_parameter + frozen / model_ranks * compute;
}

double least_run_bytes(const config::Config& config, const Runtime& runtime, const std::vector<SizedModel>& models) {
  double bytes = 0;
  for (const SizedModel& model : models) {
    if (model.trained) {
      bytes += least_training_bytes(config.model_view(model.name), runtime, model.parameters, model.frozen);
    } else {
      bytes += model.parameters * static_cast<double>(torch::elementSize(FrozenModel::dtype_of(config, model.name, runtime.device)));
    }
  }
  return bytes;
}

void check_model_fits(const config::Config& config, const Runtime& runtime, double parameters,
                      const std::vector<std::string>& model_keys, double frozen, const std::vector<SizedModel>& models) {
  const double needed = models.empty() ? least_training_bytes(config, runtime, parameters, frozen)
                                       : least_run_bytes(config, runtime, models);
  const double available = available_on(runtime.device);
  if (needed <= available) return;
  const std::string keys = keys_text(config, model_keys);
  if (!models.empty()) {
    std::string each;
    for (size_t i = 0; i < models.size(); ++i) {
      each += (i ? ", " : "") + models[i].name + " " + number_text(models[i].parameters) + (models[i].trained ? "" : " frozen");
    }
    fail("the models of " + keys + " (" + each + " parameters): their weights, gradients and optimizer " +
         "state need at least " + gib(needed) + " on each rank (each model under its own [models.<name>] memory and " +
         "precision, before activations), but this machine has " + gib(available) + " available. Make the models " +
         "smaller or spread them (memory.strategy, memory.offload_frozen, lora.rank)");
  }
  fail("the model of " + keys + " has " + number_text(parameters) + " parameters: its weights, gradients and optimizer " +
       "state need at least " + gib(needed) + " on each rank (memory.strategy = \"" +
       held_model(config).strategy + "\", before activations), but this machine has " + gib(available) +
       " available. Make the model smaller or spread it (parallel.tensor.size, parallel.pipeline, memory.strategy)");
}

void check_weights_fit(const config::Config& config, const torch::Device& device, double parameters,
                       const std::vector<std::string>& model_keys) {
  const double needed = 4 * parameters;  // float32, whole
  const double available = available_on(device);
  if (needed <= available) return;
  fail("the model of " + keys_text(config, model_keys) + " has " + number_text(parameters) + " parameters: its float32 " +
       "weights alone need " + gib(needed) + ", but this machine has " + gib(available) + " available. Evaluate, " +
       "generate and export on a machine that holds the whole model, or make it smaller");
}

void check_bytes_fit(double needed, const torch::Device& device, const std::string& what, const std::string& advice) {
  const double available = available_on(device);
  if (needed <= available) return;
  fail(what + " needs at least " + gib(needed) + ", but this machine has " + gib(available) + " available. " + advice);
}

}  // namespace kuafu::train

#include "core/nn/lora.h"

#include <algorithm>
#include <map>

#include "core/nn/cross_attention.h"
#include "core/nn/transformer_block.h"
#include "core/parallel/tensor/factory.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::nn {
namespace {

// What a block calls instead of an adapted layer. It owns no parameters: the layer holds the adapters,
// so the model's names stay the layer's.
struct LoraLinearImpl : torch::nn::Module {
  LoraLinearImpl(torch::nn::AnyModule base, torch::nn::Linear a, torch::nn::Linear b, torch::nn::Dropout dropout,
                 double scale)
      : base(std::move(base)), a(std::move(a)), b(std::move(b)), dropout(std::move(dropout)), scale(scale) {}
  torch::Tensor forward(const torch::Tensor& x) { return base.forward(x) + b(a(dropout(x))) * scale; }
  torch::nn::AnyModule base;
  torch::nn::Linear a, b;
  torch::nn::Dropout dropout;
  double scale;
};
TORCH_MODULE(LoraLinear);

bool matches(const std::string& path, const std::vector<std::string>& targets) {
  for (const std::string& target : targets) {
    if (path == target || text::ends_with(path, "." + target)) return true;
  }
  return false;
}

// The linear layers of a transformer block or a (cross-)attention with their paths under it; none for
// another module.
std::vector<std::pair<torch::nn::AnyModule*, std::string>> linear_layers(torch::nn::Module& module) {
  std::vector<std::pair<torch::nn::AnyModule*, std::string>> layers;
  if (auto* block = dynamic_cast<TransformerBlockImpl*>(&module)) {
    const BlockNames& n = block->spec.names;
    layers = {{&block->qkv, n.qkv}, {&block->q, n.q}, {&block->k, n.k}, {&block->v, n.v},
              {&block->attention_out, n.attention_out}, {&block->fc_in, n.fc_in}, {&block->fc_out, n.fc_out}};
  } else if (auto* attention = dynamic_cast<CrossAttentionImpl*>(&module)) {
    layers = {{&attention->to_q, "to_q"}, {&attention->to_k, "to_k"}, {&attention->to_v, "to_v"}, {&attention->out, "to_out.0"}};
  }
  layers.erase(std::remove_if(layers.begin(), layers.end(), [](const auto& layer) { return layer.first->is_empty(); }),
               layers.end());
  return layers;
}

}  // namespace

bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::vector<std::string> apply_lora(torch::nn::Module& model, const LoraSpec& spec) {
  KUAFU_CHECK(spec.rank > 0, "LoRA's rank must be positive, got ", spec.rank);
  KUAFU_CHECK(!spec.targets.empty(), "LoRA needs at least one target layer name");
  std::vector<std::string> adapted, seen;
  for (const auto& item : model.named_modules()) {
    for (auto& [layer, name] : linear_layers(*item.value())) {
      const std::string path = item.key() + "." + name;
      seen.push_back(path);
      if (!matches(path, spec.targets)) continue;
      auto* linear = dynamic_cast<parallel::SerialLinearImpl*>(layer->ptr().get());
      KUAFU_CHECK(linear, "LoRA adapts whole layers, but ", path,
                  " is cut by tensor parallelism: turn parallel.tensor off to fine-tune with LoRA");
      const bool out_in = linear->order() == parallel::WeightOrder::kOutIn;
      const int64_t in = linear->weight.size(out_in ? 1 : 0), out = linear->weight.size(out_in ? 0 : 1);
      // The adapters train: at least float32 (masters are made from them) beside a frozen layer held in
      // the compute dtype.
      const torch::Device device = spec.device.value_or(linear->weight.device());
      const torch::Dtype dtype = torch::promote_types(linear->weight.scalar_type(), torch::kFloat32);
      torch::nn::Linear a(torch::nn::LinearOptions(in, spec.rank).bias(false));  // draws A as PEFT does
      torch::nn::Linear b(torch::nn::LinearOptions(spec.rank, out).bias(false));
      torch::NoGradGuard no_grad;
      b->weight.zero_();
      a->to(device, dtype);
      b->to(device, dtype);
      torch::nn::Dropout dropout(spec.dropout);
      linear->register_module("lora_A", a);
      linear->register_module("lora_B", b);
      linear->register_module("lora_dropout", dropout);  // so train() and eval() reach it
      *layer = torch::nn::AnyModule(LoraLinear(*layer, a, b, dropout, spec.scale()));
      adapted.push_back(path);
    }
  }
  if (adapted.empty()) {
    std::string names;
    for (size_t i = 0; i < seen.size() && i < 8; ++i) names += (i ? ", " : "") + seen[i];
    throw Error(detail::concat("LoRA's targets (", text::join(spec.targets, ", "), ") match no linear layer of the ",
                               "model; its layers are named like ", names.empty() ? "(none)" : names));
  }
  for (auto& item : model.named_parameters()) {
    if (!is_lora_parameter(item.key())) item.value().requires_grad_(false);
  }
  return adapted;
}

bool adapts_in_out_layers(const torch::nn::Module& model) {
  for (const auto& module : model.modules(/*include_self=*/false)) {
    const auto* linear = dynamic_cast<const parallel::SerialLinearImpl*>(module.get());
    if (linear && linear->order() == parallel::WeightOrder::kInOut && linear->named_children().contains("lora_A")) return true;
  }
  return false;
}

io::NamedTensors merged_lora_weights(const torch::nn::Module& model, const LoraSpec& spec) {
  std::map<std::string, torch::Tensor> deltas;  // adapted weight name -> (alpha / r) B A in its layout
  for (const auto& item : model.named_modules()) {
    const auto* linear = dynamic_cast<const parallel::SerialLinearImpl*>(item.value().get());
    if (!linear) continue;
    torch::Tensor a, b;
    for (const auto& child : linear->named_parameters()) {
      if (child.key() == "lora_A.weight") a = child.value();
      if (child.key() == "lora_B.weight") b = child.value();
    }
    if (!a.defined() || !b.defined()) continue;
    torch::Tensor delta = torch::matmul(b.detach().to(torch::kFloat32), a.detach().to(torch::kFloat32)) * spec.scale();
    if (linear->order() == parallel::WeightOrder::kInOut) delta = delta.t();
    deltas[(item.key().empty() ? "" : item.key() + ".") + "weight"] = delta;
  }
  io::NamedTensors out;
  for (const auto& item : model.named_parameters()) {
    if (is_lora_parameter(item.key())) continue;
    torch::Tensor value = item.value().detach();
    if (auto delta = deltas.find(item.key()); delta != deltas.end()) {
      value = (value.to(torch::kFloat32) + delta->second.to(value.device())).to(value.scalar_type());
    }
    out.emplace_back(item.key(), value);
  }
  for (const auto& item : model.named_buffers()) out.emplace_back(item.key(), item.value().detach());
  return out;
}

}  // namespace kuafu::nn

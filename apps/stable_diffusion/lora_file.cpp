#include "apps/stable_diffusion/lora_file.h"

#include <map>

#include <torch/torch.h>

#include "core/io/safetensors.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::sd {
namespace {

// Each linear or convolution weight of `module` by its kohya name: `prefix` + its module path, dots as underscores.
void add_layers(torch::nn::Module& module, const std::string& prefix, std::map<std::string, torch::Tensor>& layers) {
  for (const auto& item : module.named_parameters()) {
    const std::string& name = item.key();
    if (!text::ends_with(name, ".weight") || item.value().dim() < 2) continue;
    std::string path = name.substr(0, name.size() - 7);
    for (char& c : path) c = c == '.' ? '_' : c;
    layers[prefix + path] = item.value();
  }
}

}  // namespace

int64_t merge_kohya_lora(Pipeline& pipeline, const std::string& path, double weight) {
  const io::SafetensorsFile file = io::load_safetensors(path);
  std::map<std::string, torch::Tensor> layers;
  add_layers(*pipeline.unet, "lora_unet_", layers);
  add_layers(*pipeline.text_encoder, "lora_te_", layers);
  torch::NoGradGuard no_grad;
  int64_t merged = 0;
  for (const auto& [key, down] : file.tensors) {
    const std::string suffix = ".lora_down.weight";
    if (!text::ends_with(key, suffix)) continue;
    const std::string layer = key.substr(0, key.size() - suffix.size());
    const auto found = layers.find(layer);
    KUAFU_CHECK(found != layers.end(), path, ": ", key, " adapts a layer this pipeline does not have (", layer, ")");
    const torch::Tensor* up = file.find(layer + ".lora_up.weight");
    KUAFU_CHECK(up, path, ": ", key, " has no ", layer, ".lora_up.weight");
    torch::Tensor& w = found->second;  // [out, in] or [out, in, kh, kw]
    const int64_t rank = down.size(0);
    KUAFU_CHECK(up->dim() == w.dim() && up->size(0) == w.size(0) && up->size(1) == rank && down.dim() == w.dim() &&
                    down.size(1) == w.size(1) && (w.dim() == 2 || (down.size(2) == w.size(2) && down.size(3) == w.size(3) &&
                                                                  up->size(2) == 1 && up->size(3) == 1)),
                path, ": ", layer, "'s lora_down ", down.sizes(), " and lora_up ", up->sizes(), " do not fit its weight ", w.sizes());
    const torch::Tensor* alpha = file.find(layer + ".alpha");
    const double scale = (alpha ? alpha->item<double>() : static_cast<double>(rank)) / static_cast<double>(rank);
    // up [out, r] · down [r, in·kh·kw], in float32 whatever the weights' dtype.
    const torch::Tensor delta = torch::mm(up->reshape({w.size(0), rank}).to(torch::kFloat32), down.reshape({rank, -1}).to(torch::kFloat32))
                                    .view(w.sizes());
    w.copy_((w.to(torch::kFloat32) + (weight * scale) * delta.to(w.device())).to(w.scalar_type()));
    ++merged;
  }
  KUAFU_CHECK(merged > 0, path, ": no kohya LoRA key (<layer>.lora_down.weight) in it");
  return merged;
}

}  // namespace kuafu::sd

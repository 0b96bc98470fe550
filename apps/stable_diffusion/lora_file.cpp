#include "apps/stable_diffusion/lora_file.h"

#include <functional>
#include <map>

#include <torch/torch.h>

#include "core/io/safetensors.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::sd {
namespace {

// A layer's kohya name: `prefix` + its module path, dots as underscores.
std::string kohya_name(const std::string& prefix, std::string path) {
  for (char& c : path) c = c == '.' ? '_' : c;
  return prefix + path;
}

// Each linear or convolution weight of `module` by its kohya name: `prefix` + name_of(its module path), dots as
// underscores (skipped where name_of gives "").
void add_layers(torch::nn::Module& module, const std::string& prefix, std::map<std::string, torch::Tensor>& layers,
                const std::function<std::string(const std::string&)>& name_of = [](const std::string& path) { return path; }) {
  for (const auto& item : module.named_parameters()) {
    const std::string& name = item.key();
    if (!text::ends_with(name, ".weight") || item.value().dim() < 2) continue;
    const std::string layer = name_of(name.substr(0, name.size() - 7));
    if (!layer.empty()) layers[kohya_name(prefix, layer)] = item.value();
  }
}

// A ResNet layer's name in the original model ("" for one it has no LoRA name for).
std::string original_resnet_layer(const std::string& layer) {
  static const std::map<std::string, std::string> names = {
      {"conv1", "in_layers.2"}, {"conv2", "out_layers.3"}, {"time_emb_proj", "emb_layers.1"}, {"conv_shortcut", "skip_connection"}};
  const auto found = names.find(layer);
  return found == names.end() ? "" : found->second;
}

// The original (SGM) model's path of the UNet layer at diffusers' `path`, as sd-scripts names SDXL's LoRA layers
// ("down_blocks.1.attentions.0.proj_in" -> "input_blocks.4.1.proj_in" with 2 layers a block), or "" for a layer the
// original names otherwise. Down block b's layer l is input block 1 + b (L + 1) + l (its downsampler the block's
// last, "op"); up block b's is output block b (L + 1) + l, the upsampler beside the last layer's ResNet (and
// attention); the middle block is ResNet, attention, ResNet. L and which up blocks have attention: from `unet`.
std::string original_unet_path(const std::string& path, const UNetConfig& unet) {
  static const std::map<std::string, std::string> outside_blocks = {
      {"conv_in", "input_blocks.0.0"},        {"time_embedding.linear_1", "time_embed.0"}, {"time_embedding.linear_2", "time_embed.2"},
      {"add_embedding.linear_1", "label_emb.0.0"}, {"add_embedding.linear_2", "label_emb.0.2"}, {"conv_out", "out.2"}};
  if (const auto found = outside_blocks.find(path); found != outside_blocks.end()) return found->second;
  // [down_blocks|up_blocks].<block>.<kind>.<layer>.<rest> or mid_block.<kind>.<layer>.<rest>
  const std::vector<std::string> parts = text::split(path, '.');
  const size_t at = parts[0] == "mid_block" ? 1 : 2;  // where the kind is
  const auto digits = [](const std::string& t) { return !t.empty() && t.find_first_not_of("0123456789") == std::string::npos; };
  if (parts.size() < at + 3 || !digits(parts[at + 1]) || (at == 2 && ((parts[0] != "down_blocks" && parts[0] != "up_blocks") || !digits(parts[1]))))
    return "";
  const std::string& kind = parts[at];
  const int64_t block = at == 2 ? std::stoll(parts[1]) : 0, layer = std::stoll(parts[at + 1]);
  std::string rest = parts[at + 2];
  for (size_t i = at + 3; i < parts.size(); ++i) rest += "." + parts[i];
  // The pieces joined with dots, or "" when a piece has no original name.
  const auto joined = [](std::initializer_list<std::string> pieces) {
    std::string out;
    for (const std::string& piece : pieces) {
      if (piece.empty()) return std::string();
      out += (out.empty() ? "" : ".") + piece;
    }
    return out;
  };
  const auto number = [](int64_t i) { return std::to_string(i); };
  const int64_t per_block = unet.layers_per_block;
  if (parts[0] == "down_blocks") {
    const int64_t first = 1 + block * (per_block + 1);
    if (kind == "resnets") return joined({"input_blocks", number(first + layer), "0", original_resnet_layer(rest)});
    if (kind == "attentions") return joined({"input_blocks", number(first + layer), "1", rest});
    if (kind == "downsamplers" && rest == "conv") return joined({"input_blocks", number(first + per_block), "0", "op"});
  } else if (parts[0] == "up_blocks") {
    const int64_t first = block * (per_block + 1);
    if (kind == "resnets") return joined({"output_blocks", number(first + layer), "0", original_resnet_layer(rest)});
    if (kind == "attentions") return joined({"output_blocks", number(first + layer), "1", rest});
    if (kind == "upsamplers") return joined({"output_blocks", number(first + per_block), text::starts_with(unet.up_block_types.at(block), "CrossAttn") ? "2" : "1", rest});
  } else if (parts[0] == "mid_block") {
    if (kind == "resnets") return joined({"middle_block", number(2 * layer), original_resnet_layer(rest)});
    if (kind == "attentions") return joined({"middle_block", "1", rest});
  }
  return "";
}

}  // namespace

int64_t merge_kohya_lora(Pipeline& pipeline, const std::string& path, double weight) {
  const io::SafetensorsFile file = io::load_safetensors(path);
  std::map<std::string, torch::Tensor> layers;
  add_layers(*pipeline.unet, "lora_unet_", layers);
  // sd-scripts names SDXL's UNet layers (and LyCORIS some SD 1.x files') by the original model's blocks.
  add_layers(*pipeline.unet, "lora_unet_", layers, [&](const std::string& layer) { return original_unet_path(layer, pipeline.unet->config); });
  // kohya names SDXL's encoders te1 and te2, SD 1.x/2.x's te; diffusers' convert_state_dict_to_kohya writes te1 for both,
  // and without the "text_model" level, which transformers 5's CLIP models no longer have.
  const auto add_encoder = [&](ClipTextModel& encoder, const std::string& prefix) {
    add_layers(*encoder, prefix, layers);
    add_layers(*encoder, prefix, layers, [](const std::string& layer) {
      return text::starts_with(layer, "text_model.") ? layer.substr(std::string("text_model.").size()) : std::string();
    });
  };
  add_encoder(pipeline.text_encoder, "lora_te1_");
  if (pipeline.sdxl()) {
    add_encoder(pipeline.text_encoder_2, "lora_te2_");
  } else {
    add_encoder(pipeline.text_encoder, "lora_te_");
  }
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

io::NamedTensors kohya_lora_tensors(const torch::nn::Module& unet, const nn::LoraSpec& spec, const std::string& prefix) {
  const std::string a_suffix = ".lora_A.weight";
  const auto parameters = unet.named_parameters();
  io::NamedTensors out;
  for (const auto& item : parameters) {
    if (!text::ends_with(item.key(), a_suffix)) continue;
    const std::string layer = item.key().substr(0, item.key().size() - a_suffix.size());
    const torch::Tensor* b = parameters.find(layer + ".lora_B.weight");
    KUAFU_CHECK(b, "the adapter of ", layer, " has lora_A but no lora_B");
    const std::string name = kohya_name(prefix, layer);
    out.emplace_back(name + ".lora_down.weight", item.value().detach().to(torch::kFloat32).contiguous());  // [r, in]
    out.emplace_back(name + ".lora_up.weight", b->detach().to(torch::kFloat32).contiguous());               // [out, r]
    out.emplace_back(name + ".alpha", torch::tensor(static_cast<float>(spec.alpha)));
  }
  KUAFU_CHECK(!out.empty(), "the model has no LoRA adapters to write in kohya's format (lora.rank = 0)");
  return out;
}

}  // namespace kuafu::sd

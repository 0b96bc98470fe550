#include "apps/stable_diffusion/unet_folder.h"

#include <unistd.h>

#include <filesystem>

#include "apps/stable_diffusion/lora_file.h"
#include "core/train/hf_interop.h"
#include "core/train/lazy_model.h"
#include "core/train/peft_adapter.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::sd {

namespace {

// An int or a list of ints (one per block) as a list of `blocks` values.
std::vector<int64_t> per_block(const nlohmann::json& value, size_t blocks, const std::string& where, const std::string& key) {
  if (value.is_number_integer()) return std::vector<int64_t>(blocks, value.get<int64_t>());
  KUAFU_CHECK(value.is_array() && value.size() == blocks, where, ": ", key, " must be a number or one per block (", blocks, ")");
  std::vector<int64_t> out;
  for (const auto& v : value) {
    KUAFU_CHECK(v.is_number_integer(), where, ": ", key, " holds ", v.dump(), ", not a number");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

std::vector<std::string> strings(const nlohmann::json& json, const std::string& key, const std::string& where) {
  KUAFU_CHECK(json.contains(key) && json[key].is_array(), where, ": ", key, " must be a list");
  std::vector<std::string> out;
  for (const auto& v : json[key]) {
    KUAFU_CHECK(v.is_string(), where, ": ", key, " holds ", v.dump(), ", not a block type");
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

UNetConfig read_unet_config(const nlohmann::json& json, const std::string& where) {
  const std::string kind = io::config_value<std::string>(json, "_class_name", "", where);
  KUAFU_CHECK(kind == "UNet2DConditionModel", where, ": _class_name \"", text::abbreviate(kind), "\" is not UNet2DConditionModel");
  // What Kuafu's UNet does not compute: each would load and silently compute another model.
  for (const char* key : {"class_embed_type", "encoder_hid_dim", "encoder_hid_dim_type", "num_class_embeds", "time_cond_proj_dim",
                          "timestep_post_act", "time_embedding_act_fn", "time_embedding_dim", "cross_attention_norm",
                          "reverse_transformer_layers_per_block"}) {
    KUAFU_CHECK(!json.contains(key) || json[key].is_null(), where, ": ", key, " = ", json.contains(key) ? json[key].dump() : "",
                " is not supported (SD 1.x, 2.x and SDXL have none)");
  }
  const std::vector<std::pair<std::string, nlohmann::json>> expected = {
      {"time_embedding_type", "positional"}, {"resnet_time_scale_shift", "default"}, {"mid_block_type", "UNetMidBlock2DCrossAttn"},
      {"only_cross_attention", false},       {"dual_cross_attention", false},        {"center_input_sample", false},
      {"conv_in_kernel", 3},                 {"conv_out_kernel", 3},                 {"act_fn", "silu"},
      {"attention_type", "default"},         {"mid_block_scale_factor", 1},
      {"class_embeddings_concat", false},    {"mid_block_only_cross_attention", false}};
  for (const auto& [key, value] : expected) {
    KUAFU_CHECK(!json.contains(key) || json[key].is_null() || json[key] == value, where, ": ", key, " = ", json[key].dump(),
                " is not supported (Kuafu's UNet computes ", value.dump(), ")");
  }
  UNetConfig c;
  c.in_channels = io::config_value<int64_t>(json, "in_channels", 4, where);
  c.out_channels = io::config_value<int64_t>(json, "out_channels", 4, where);
  c.layers_per_block = io::config_value<int64_t>(json, "layers_per_block", 2, where);
  c.norm_num_groups = io::config_value<int64_t>(json, "norm_num_groups", 32, where);
  c.norm_eps = io::config_value<double>(json, "norm_eps", 1e-5, where);
  c.cross_attention_dim = io::config_value<int64_t>(json, "cross_attention_dim", 1280, where);
  c.use_linear_projection = io::config_value<bool>(json, "use_linear_projection", false, where);
  c.upcast_attention = io::config_value<bool>(json, "upcast_attention", false, where);
  c.flip_sin_to_cos = io::config_value<bool>(json, "flip_sin_to_cos", true, where);
  c.freq_shift = io::config_value<double>(json, "freq_shift", 0.0, where);
  c.downsample_padding = io::config_value<int64_t>(json, "downsample_padding", 1, where);
  c.sample_size = io::config_value<int64_t>(json, "sample_size", 64, where);
  c.down_block_types = strings(json, "down_block_types", where);
  c.up_block_types = strings(json, "up_block_types", where);
  c.block_out_channels = per_block(json.value("block_out_channels", nlohmann::json()), c.down_block_types.size(), where, "block_out_channels");
  // diffusers' attention_head_dim is the head count (its old name); num_attention_heads, when set, is.
  const nlohmann::json heads = json.contains("num_attention_heads") && !json["num_attention_heads"].is_null() ? json["num_attention_heads"]
                                                                                                               : json.value("attention_head_dim", nlohmann::json(8));
  c.heads = per_block(heads, c.block_out_channels.size(), where, "attention_head_dim");
  if (json.contains("transformer_layers_per_block") && !json["transformer_layers_per_block"].is_null()) {
    c.transformer_depth = per_block(json["transformer_layers_per_block"], c.block_out_channels.size(), where, "transformer_layers_per_block");
  }
  if (json.contains("addition_embed_type") && !json["addition_embed_type"].is_null()) {
    c.addition_embed_type = io::config_value<std::string>(json, "addition_embed_type", "", where);
    c.addition_time_embed_dim = io::config_value<int64_t>(json, "addition_time_embed_dim", 0, where);
    c.projection_class_embeddings_input_dim = io::config_value<int64_t>(json, "projection_class_embeddings_input_dim", 0, where);
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where + ": " + e.what());
  }
  return c;
}

nlohmann::json write_unet_config(const UNetConfig& c) {
  nlohmann::json json = {{"_class_name", "UNet2DConditionModel"},
                         {"in_channels", c.in_channels},
                         {"out_channels", c.out_channels},
                         {"down_block_types", c.down_block_types},
                         {"up_block_types", c.up_block_types},
                         {"block_out_channels", c.block_out_channels},
                         {"layers_per_block", c.layers_per_block},
                         {"norm_num_groups", c.norm_num_groups},
                         {"norm_eps", c.norm_eps},
                         {"cross_attention_dim", c.cross_attention_dim},
                         {"attention_head_dim", c.heads},
                         {"use_linear_projection", c.use_linear_projection},
                         {"upcast_attention", c.upcast_attention},
                         {"flip_sin_to_cos", c.flip_sin_to_cos},
                         {"freq_shift", c.freq_shift},
                         {"downsample_padding", c.downsample_padding},
                         {"sample_size", c.sample_size},
                         {"act_fn", "silu"},
                         {"mid_block_type", "UNetMidBlock2DCrossAttn"}};
  if (!c.transformer_depth.empty()) json["transformer_layers_per_block"] = c.transformer_depth;
  if (c.text_time()) {
    json["addition_embed_type"] = c.addition_embed_type;
    json["addition_time_embed_dim"] = c.addition_time_embed_dim;
    json["projection_class_embeddings_input_dim"] = c.projection_class_embeddings_input_dim;
  }
  return json;
}

train::ModelRecipe<UNet2DCondition> unet_folder_recipe(const std::string& dir) {
  train::ModelRecipe<UNet2DCondition> recipe{"", /*trained=*/false};
  recipe.describe = train::described_whole<UNet2DCondition>(read_unet_config(io::read_hf_config(dir), dir + "/config.json"));
  recipe.draw = [dir](UNet2DCondition& unet) { load_unet_weights(*unet, io::read_hf_folder(dir)); };
  return recipe;
}

UNet2DCondition load_unet(const std::string& dir, const torch::Device& device, torch::Dtype dtype) {
  return train::build_as(unet_folder_recipe(dir), train::Materialization::all_in(device, dtype));
}

void load_unet_weights(UNet2DConditionImpl& unet, const io::HfFolder& folder) {
  train::load_pretrained(unet, parallel::TensorParallel{}, folder, train::HfWeightNames{});
}

void save_unet(UNet2DCondition& unet, const std::string& dir, const io::HfWriteOptions& options) {
  io::HfWriteOptions written = options;
  written.weights_stem = "diffusion_pytorch_model";
  train::export_pretrained(*unet, parallel::TensorParallel{}, dir, write_unet_config(unet->config), written);
}

void export_unet_adapter(const UNet2DConditionImpl& unet, const nn::LoraSpec& spec, const std::string& dir, const std::string& base_unet_dir,
                         const std::vector<AdaptedTextEncoder>& text_encoders) {
  io::NamedTensors adapters;
  nlohmann::json config;  // diffusers reads each component's LoraConfig from this metadata, its keys prefixed by the component
  const auto add = [&](const std::string& component, const torch::nn::Module& model, const nn::LoraSpec& s, const std::string& drop) {
    size_t added = 0;
    for (const auto& item : model.named_parameters()) {
      if (!nn::is_lora_parameter(item.key())) continue;
      const std::string path = item.key().rfind(drop, 0) == 0 ? item.key().substr(drop.size()) : item.key();
      adapters.emplace_back(component + "." + path, item.value().detach().to(torch::kFloat32));
      ++added;
    }
    KUAFU_CHECK(added > 0, "the ", component, " has no LoRA adapters to export (lora.rank = 0)");
    config.update({{component + ".r", s.rank},           {component + ".lora_alpha", s.alpha}, {component + ".lora_dropout", s.dropout},
                   {component + ".target_modules", s.targets}, {component + ".bias", "none"},    {component + ".use_rslora", false},
                   {component + ".use_dora", false}});
  };
  add("unet", unet, spec, "");
  io::NamedTensors kohya = kohya_lora_tensors(unet, spec);
  for (const AdaptedTextEncoder& encoder : text_encoders) {
    add(encoder.component, *encoder.model, encoder.spec, "text_model.");
    const std::string prefix = text_encoders.size() == 1 ? "lora_te_" : encoder.component == "text_encoder" ? "lora_te1_" : "lora_te2_";
    const io::NamedTensors tensors = kohya_lora_tensors(*encoder.model, encoder.spec, prefix);
    kohya.insert(kohya.end(), tensors.begin(), tensors.end());
  }
  // Written beside the new folder first, then copied in with the PEFT files.
  const std::filesystem::path staging = std::filesystem::absolute(dir).string() + ".lora-" + std::to_string(::getpid());
  std::filesystem::remove_all(staging);
  std::filesystem::create_directories(staging);
  const std::string diffusers_file = (staging / "pytorch_lora_weights.safetensors").string();
  // kohya's format too, the one ComfyUI and A1111 read (and diffusers' load_lora_weights with weight_name).
  const std::string kohya_file = (staging / kKohyaLoraFile).string();
  try {
    io::save_safetensors(diffusers_file, adapters, {{"lora_adapter_metadata", config.dump()}, {"format", "pt"}});
    io::save_safetensors(kohya_file, kohya, {{"ss_network_dim", std::to_string(spec.rank)},
                                                                      {"ss_network_alpha", nlohmann::json(spec.alpha).dump()}});
    train::export_adapter(unet, spec, dir, base_unet_dir, train::AdapterFolderOptions{std::nullopt, {diffusers_file, kohya_file}});
  } catch (...) {
    std::filesystem::remove_all(staging);
    throw;
  }
  std::filesystem::remove_all(staging);
}

}  // namespace kuafu::sd

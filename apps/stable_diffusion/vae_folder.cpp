#include "apps/stable_diffusion/vae_folder.h"

#include "core/train/hf_interop.h"
#include "core/train/lazy_model.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::sd {

namespace {

// The older attention names (query, key, value, proj_attn) as the current ones.
void rename_old_attention(io::HfFolder& folder) {
  static const std::vector<std::pair<std::string, std::string>> renamed = {
      {".query.", ".to_q."}, {".key.", ".to_k."}, {".value.", ".to_v."}, {".proj_attn.", ".to_out.0."}};
  for (io::HfTensor& t : folder.tensors) {
    if (t.name.find(".attentions.") == std::string::npos) continue;
    for (const auto& [old_name, name] : renamed) {
      if (const size_t at = t.name.find(old_name); at != std::string::npos) {
        t.name.replace(at, old_name.size(), name);
      }
    }
  }
}

}  // namespace

VaeConfig read_vae_config(const nlohmann::json& json, const std::string& where) {
  const std::string kind = io::config_value<std::string>(json, "_class_name", "", where);
  KUAFU_CHECK(kind == "AutoencoderKL", where, ": _class_name \"", text::abbreviate(kind), "\" is not AutoencoderKL");
  VaeConfig c;
  c.in_channels = io::config_value<int64_t>(json, "in_channels", 3, where);
  c.out_channels = io::config_value<int64_t>(json, "out_channels", 3, where);
  c.latent_channels = io::config_value<int64_t>(json, "latent_channels", 4, where);
  c.layers_per_block = io::config_value<int64_t>(json, "layers_per_block", 1, where);
  c.norm_num_groups = io::config_value<int64_t>(json, "norm_num_groups", 32, where);
  c.scaling_factor = io::config_value<double>(json, "scaling_factor", 0.18215, where);
  c.sample_size = io::config_value<int64_t>(json, "sample_size", 32, where);
  c.mid_block_add_attention = io::config_value<bool>(json, "mid_block_add_attention", true, where);
  c.use_quant_conv = io::config_value<bool>(json, "use_quant_conv", true, where);
  c.use_post_quant_conv = io::config_value<bool>(json, "use_post_quant_conv", true, where);
  KUAFU_CHECK(json.contains("block_out_channels") && json["block_out_channels"].is_array(), where,
              ": block_out_channels must be a list of channel counts");
  c.block_out_channels.clear();
  for (const auto& v : json["block_out_channels"]) {
    KUAFU_CHECK(v.is_number_integer(), where, ": block_out_channels holds ", v.dump(), ", not a channel count");
    c.block_out_channels.push_back(v.get<int64_t>());
  }
  KUAFU_CHECK(io::config_value<std::string>(json, "act_fn", "silu", where) == "silu", where, ": act_fn must be silu");
  for (const auto& [key, block] : {std::pair<std::string, std::string>{"down_block_types", "DownEncoderBlock2D"},
                                   {"up_block_types", "UpDecoderBlock2D"}}) {
    if (!json.contains(key)) continue;
    KUAFU_CHECK(json[key].is_array() && json[key].size() == c.block_out_channels.size(), where, ": ", key,
                " must list one block per block_out_channels entry");
    for (const auto& type : json[key]) {
      KUAFU_CHECK(type == block, where, ": ", key, " holds ", type.dump(), "; Kuafu's VAE builds ", block, " only");
    }
  }
  for (const char* key : {"shift_factor", "latents_mean", "latents_std"}) {
    KUAFU_CHECK(!json.contains(key) || json[key].is_null(), where, ": ", key, " is set (a later model's latent normalisation); "
                "Kuafu's VAE scales by scaling_factor only");
  }
  try {
    c.validate();
  } catch (const Error& e) {
    fail(where + ": " + e.what());
  }
  return c;
}

nlohmann::json write_vae_config(const VaeConfig& c) {
  const size_t n = c.block_out_channels.size();
  return {{"_class_name", "AutoencoderKL"},
          {"in_channels", c.in_channels},
          {"out_channels", c.out_channels},
          {"latent_channels", c.latent_channels},
          {"block_out_channels", c.block_out_channels},
          {"down_block_types", std::vector<std::string>(n, "DownEncoderBlock2D")},
          {"up_block_types", std::vector<std::string>(n, "UpDecoderBlock2D")},
          {"layers_per_block", c.layers_per_block},
          {"act_fn", "silu"},
          {"norm_num_groups", c.norm_num_groups},
          {"scaling_factor", c.scaling_factor},
          {"sample_size", c.sample_size},
          {"force_upcast", true},
          {"mid_block_add_attention", c.mid_block_add_attention},
          {"use_quant_conv", c.use_quant_conv},
          {"use_post_quant_conv", c.use_post_quant_conv}};
}

namespace {

void read_vae_weights(AutoencoderKL& vae, io::HfFolder folder) {
  rename_old_attention(folder);
  train::load_pretrained(*vae, parallel::TensorParallel{}, folder, train::HfWeightNames{});
}

}  // namespace

train::ModelRecipe<AutoencoderKL> vae_folder_recipe(const std::string& dir, const std::string& name, bool trained) {
  train::ModelRecipe<AutoencoderKL> recipe{name, trained};
  recipe.describe = train::described_whole<AutoencoderKL>(read_vae_config(io::read_hf_config(dir), dir + "/config.json"));
  recipe.draw = [dir](AutoencoderKL& vae) { load_vae_weights(vae, dir); };  // a missing weight is refused
  for (const auto& p : recipe.describe({})->parameters()) recipe.parameters += static_cast<double>(p.numel());
  return recipe;
}

AutoencoderKL load_vae(const std::string& dir, const torch::Device& device, torch::Dtype dtype) {
  return train::build_as(vae_folder_recipe(dir), train::Materialization::all_in(device, dtype));
}

void load_vae_weights(AutoencoderKL& vae, const std::string& dir) { read_vae_weights(vae, io::read_hf_folder(dir)); }

void save_vae(AutoencoderKL& vae, const std::string& dir, const io::HfWriteOptions& options) {
  io::HfWriteOptions written = options;
  written.weights_stem = "diffusion_pytorch_model";
  train::export_pretrained(*vae, parallel::TensorParallel{}, dir, write_vae_config(vae->config), written);
}

}  // namespace kuafu::sd

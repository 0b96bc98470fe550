#include "apps/stable_diffusion/sample_command.h"

#ifdef KUAFU_WITH_IMAGE_CODECS
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "apps/stable_diffusion/lora_file.h"
#include "apps/stable_diffusion/textual_inversion_file.h"
#include "apps/stable_diffusion/pipeline.h"
#include "core/io/png_file.h"
#include "core/io/safetensors.h"
#include "core/optim/mixed_precision.h"
#include "core/train/runtime.h"
#include "core/util/device.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::sd {

namespace {

const char* const kHelp =
    "usage: kuafu-sd sample --model DIR --prompt TEXT [--prompt TEXT ...] --out FILE.png [options]\n"
    "\n"
    "Text to images from a diffusers Stable Diffusion pipeline folder (model_index.json, tokenizer/,\n"
    "text_encoder/, unet/, vae/, scheduler/; SDXL's also tokenizer_2/ and text_encoder_2/), written as one PNG\n"
    "grid: the prompts side by side, a row per seed.\n"
    "  --images-per-prompt N  N images of each prompt side by side in a row, drawn as one batch (diffusers'\n"
    "                       num_images_per_prompt; default 1)\n"
    "  --output-latents F   write the final latents there (safetensors \"latents\" [rows, 4, h, w], the grid's\n"
    "                       order; diffusers' output_type=\"latent\"); --out is then optional: without it\n"
    "                       nothing is decoded\n"
    "  --output-embeddings F  write the text embeddings the UNet attends to there (safetensors \"prompt_embeds\"\n"
    "                       and, with guidance, \"negative_prompt_embeds\" [images, 77, D]; diffusers' encode_prompt)\n"
    "  --steps N            sampling steps (default 50)\n"
    "  --guidance G         classifier-free guidance scale; 1 or less: none (default 7.5)\n"
    "  --negative-prompt T  what guidance steers away from instead of the empty caption: once for every\n"
    "                       prompt, or once per --prompt in their order\n"
    "  --guidance-rescale R rescale the guided prediction to the conditional one's spread, mixed by R in\n"
    "                       [0, 1] (diffusers' guidance_rescale; 0.7 in its paper; default 0: none)\n"
    "  --sampler NAME       ddim, ddpm, euler, euler_a (ancestral), heun (two UNet calls a step but the\n"
    "                       last), dpm++2m or unipc (default: the folder's scheduler class)\n"
    "  --eta E              DDIM's eta in [0, 1]: 0 deterministic (default), 1 DDPM's variance\n"
    "  --karras-sigmas B    true: euler's, heun's, dpm++2m's and unipc's noise levels spaced as Karras et al. (\"DPM++ 2M\n"
    "                       Karras\"); false: the schedule's (default: the folder's use_karras_sigmas)\n"
    "  --seed S             the CPU generator's seed for the initial noise and DDPM's (default 0); once per\n"
    "                       row of the grid\n"
    "  --height H --width W pixels (default: the UNet's sample_size x the VAE's factor)\n"
    "  --latents FILE       start from this initial noise (safetensors, tensor \"latents\" [B, 4, h, w])\n"
    "  --save-latents FILE  write the initial noise there (every row's, seed by seed)\n"
    "  --init-image FILE    img2img: start from this image (PNG, JPEG; its alpha left out; sides multiples of the\n"
    "                       VAE's factor) instead of pure noise (diffusers' StableDiffusionImg2ImgPipeline)\n"
    "  --strength S         img2img: how far in (0, 1] the image is noised, the last S of the steps taken (default 0.8;\n"
    "                       with --mask 1: from pure noise)\n"
    "  --mask FILE          inpainting, with --init-image: the image's part to repaint, white (read as grey, 0.5 or\n"
    "                       more), at the image's size; an inpainting pipeline's UNet sees it, a plain one's result\n"
    "                       keeps the rest (diffusers' StableDiffusionInpaintPipeline)\n"
    "  --vae-tile PX|auto   decode in overlapping tiles of PX pixels (auto: the VAE's sample_size, as\n"
    "                       diffusers' enable_tiling), so a large image fits in less memory (default: whole)\n"
    "  --lora FILE[:W]      merge a LoRA in kohya's format (lora_unet_* / lora_te_*: sd-scripts, ComfyUI, A1111)\n"
    "                       into the UNet and text encoder at weight W (default 1); repeat for several\n"
    "  --embedding FILE[:TOKEN]  add a textual-inversion concept (diffusers' learned_embeds.safetensors, A1111's\n"
    "                       emb_params, SDXL's clip_l/clip_g) to the prompts' words as TOKEN (default: the file's\n"
    "                       one key, else its name); repeat for several\n"
    "  --dtype D            fp32 (default), bf16 or fp16: the text encoder and the UNet compute in it (diffusers'\n"
    "                       torch_dtype); the sampler's steps stay float32 and the VAE runs in float32\n"
    "  --device DEV         cpu (default), cuda, cuda:N\n";

int64_t number(const std::string& option, const std::string& value) {
  try {
    size_t used = 0;
    const int64_t n = std::stoll(value, &used);
    if (used == value.size()) return n;
  } catch (const std::exception&) {
  }
  fail(option + " " + value + " is not a whole number");
}

double real(const std::string& option, const std::string& value) {
  try {
    size_t used = 0;
    const double x = std::stod(value, &used);
    if (used == value.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  fail(option + " " + value + " is not a number");
}

// An image file (`option` names it) as [1, 3, H, W] RGB in [0, 1], or with `grey` [1, 1, H, W] (ITU-R 601 luma, as
// PIL's convert("L")); its alpha channel left out (as PIL's convert) and its EXIF orientation ignored (as PIL's open).
torch::Tensor read_image(const std::string& option, const std::string& path, bool grey = false) {
  KUAFU_CHECK(std::filesystem::is_regular_file(path), option, " ", path, ": no such file");
#ifndef KUAFU_WITH_IMAGE_CODECS
  fail("cannot read " + path + ": this build has no image decoding (KUAFU_WITH_IMAGE_CODECS=OFF)");
#else
  const cv::Mat read = cv::imread(path, (grey ? cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR) | cv::IMREAD_IGNORE_ORIENTATION);
  KUAFU_CHECK(!read.empty() && read.depth() == CV_8U, option, " ", path, ": not an 8-bit image OpenCV reads (PNG, JPEG, ...)");
  cv::Mat pixels = read;
  if (!grey) cv::cvtColor(read, pixels, cv::COLOR_BGR2RGB);
  const torch::Tensor hwc = torch::from_blob(pixels.data, {pixels.rows, pixels.cols, pixels.channels()}, torch::kUInt8);  // pixels' memory
  return hwc.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32) / 255;  // [1, 3 or 1, H, W]
#endif
}

void sample_command(int argc, const char* const argv[]) {
  std::string model, out, latents_in, latents_out, device = "cpu", sampler_name, vae_tile, final_out, embeddings_out, init_image;
  std::string dtype = "fp32", mask;
  std::optional<double> strength;
  std::vector<std::pair<std::string, double>> loras;  // file, weight
  std::vector<std::pair<std::string, std::string>> embedding_files;  // file, token ("": the file's own)
  std::vector<std::string> prompts;
  std::vector<uint64_t> seeds;
  SampleOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kHelp;
      return;
    }
    KUAFU_CHECK(text::starts_with(arg, "--") && i + 1 < argc, "unexpected argument \"", text::abbreviate(arg),
                "\" (kuafu-sd sample --help)");
    const std::string value = argv[++i];
    if (arg == "--model") {
      model = value;
    } else if (arg == "--prompt") {
      prompts.push_back(value);
    } else if (arg == "--out") {
      out = value;
    } else if (arg == "--steps") {
      options.steps = number(arg, value);
    } else if (arg == "--guidance") {
      options.guidance = real(arg, value);
    } else if (arg == "--eta") {
      options.eta = real(arg, value);
    } else if (arg == "--karras-sigmas") {
      KUAFU_CHECK(value == "true" || value == "false", "--karras-sigmas ", text::abbreviate(value), " is not true or false");
      options.karras_sigmas = value == "true";
    } else if (arg == "--negative-prompt") {
      options.negative_prompts.push_back(value);
    } else if (arg == "--guidance-rescale") {
      options.guidance_rescale = real(arg, value);
      KUAFU_CHECK(options.guidance_rescale >= 0 && options.guidance_rescale <= 1, "--guidance-rescale ", value, " is not in [0, 1]");
    } else if (arg == "--sampler") {
      sampler_name = value;
      options.sampler = sampler_named(value);
    } else if (arg == "--seed") {
      seeds.push_back(static_cast<uint64_t>(number(arg, value)));
    } else if (arg == "--height") {
      options.height = number(arg, value);
    } else if (arg == "--width") {
      options.width = number(arg, value);
    } else if (arg == "--latents") {
      latents_in = value;
    } else if (arg == "--save-latents") {
      latents_out = value;
    } else if (arg == "--output-latents") {
      final_out = value;
    } else if (arg == "--output-embeddings") {
      embeddings_out = value;
    } else if (arg == "--images-per-prompt") {
      options.images_per_prompt = number(arg, value);
      KUAFU_CHECK(options.images_per_prompt >= 1, "--images-per-prompt ", value, " is not at least 1");
    } else if (arg == "--init-image") {
      init_image = value;
    } else if (arg == "--strength") {
      strength = real(arg, value);
      KUAFU_CHECK(*strength > 0 && *strength <= 1, "--strength ", value, " is not in (0, 1]");
    } else if (arg == "--mask") {
      mask = value;
    } else if (arg == "--vae-tile") {
      vae_tile = value;
    } else if (arg == "--lora") {
      // FILE or FILE:WEIGHT (a colon followed by a number).
      const size_t colon = value.rfind(':');
      double w = 1.0;
      std::string file = value;
      if (colon != std::string::npos) {
        try {
          size_t used = 0;
          w = std::stod(value.substr(colon + 1), &used);
          if (used == value.size() - colon - 1) file = value.substr(0, colon);
          else w = 1.0;
        } catch (const std::exception&) {
          w = 1.0;
        }
      }
      KUAFU_CHECK(std::filesystem::is_regular_file(file), "--lora ", file, ": no such file");
      loras.emplace_back(file, w);
    } else if (arg == "--embedding") {
      // FILE or FILE:TOKEN (a colon after which no path separator follows).
      const size_t colon = value.rfind(':');
      const bool named = colon != std::string::npos && value.find('/', colon) == std::string::npos && colon + 1 < value.size();
      const std::string file = named ? value.substr(0, colon) : value;
      KUAFU_CHECK(std::filesystem::is_regular_file(file), "--embedding ", file, ": no such file");
      embedding_files.emplace_back(file, named ? value.substr(colon + 1) : "");
    } else if (arg == "--dtype") {
      KUAFU_CHECK(value == "fp32" || value == "bf16" || value == "fp16", "--dtype ", text::abbreviate(value), " is not fp32, bf16 or fp16");
      dtype = value;
    } else if (arg == "--device") {
      device = value;
    } else {
      fail("unknown option " + arg + " (kuafu-sd sample --help)");
    }
  }
  KUAFU_CHECK(!model.empty(), "--model DIR is required: a diffusers pipeline folder (kuafu-sd sample --help)");
  KUAFU_CHECK(!prompts.empty(), "--prompt TEXT is required (once per image)");
  KUAFU_CHECK((!out.empty() && text::ends_with(out, ".png")) || (out.empty() && !final_out.empty()),
              "--out FILE.png is required (or --output-latents alone, which decodes nothing)");
  KUAFU_CHECK(out.empty() || !std::filesystem::is_directory(out), "--out ", out, " is a folder: name the grid's .png file");
  for (const auto& [option, path] : {std::pair<const char*, std::string>{"--output-latents", final_out}, {"--output-embeddings", embeddings_out}}) {
    KUAFU_CHECK(path.empty() || text::ends_with(path, ".safetensors"), option, " ", path, " must name a .safetensors file");
    KUAFU_CHECK(path.empty() || !std::filesystem::is_directory(path), option, " ", path, " is a folder: name the .safetensors file");
  }
  options.decode = !out.empty();
  KUAFU_CHECK(options.negative_prompts.size() <= 1 || options.negative_prompts.size() == prompts.size(), "--negative-prompt given ",
              options.negative_prompts.size(), " times for ", prompts.size(), " prompts: once for all, or once per --prompt");
  if (seeds.empty()) seeds.push_back(0);
  KUAFU_CHECK(latents_in.empty() || seeds.size() == 1, "--latents gives the initial noise of one row of images; name at most one --seed with it");
  if (!latents_in.empty()) {
    const io::SafetensorsFile file = io::load_safetensors(latents_in);
    const torch::Tensor* latents = file.find("latents");
    KUAFU_CHECK(latents, latents_in, " holds no tensor \"latents\"");
    options.initial_latents = latents->to(torch::kFloat32);
  }
  KUAFU_CHECK(init_image.empty() || latents_in.empty(), "--init-image and --latents both give where sampling starts: name one");
  KUAFU_CHECK(mask.empty() || !init_image.empty(), "--mask needs --init-image: the image it repaints");
  if (!init_image.empty()) options.init_image = read_image("--init-image", init_image);
  if (!mask.empty()) options.mask_image = read_image("--mask", mask, /*grey=*/true);
  options.strength = strength.value_or(mask.empty() ? 0.8 : 1.0);  // diffusers' defaults: img2img 0.8, inpainting 1
  // The weights read straight into the compute dtype; the VAE's in float32, which it decodes in whatever the dtype.
  const torch::Dtype compute = optim::dtype_named(dtype);
  Pipeline pipeline = load_pipeline(model, resolve_device(device, 0), PipelineLoad{compute, compute, torch::kFloat32});
  std::vector<std::string> lora_names;
  for (const auto& [file, w] : loras) {
    const int64_t layers = merge_kohya_lora(pipeline, file, w);
    std::ostringstream name;
    name << file << ":" << w;
    lora_names.push_back(name.str());
    std::cout << file << ": " << layers << " layers merged at weight " << w << "\n";
  }
  std::vector<std::string> concepts;
  for (const auto& [file, token] : embedding_files) {
    concepts.push_back(load_textual_inversion(pipeline, file, token));
    std::cout << file << ": concept " << concepts.back() << " added\n";
  }
  if (!vae_tile.empty()) {
    options.vae_tile = vae_tile == "auto" ? pipeline.vae->config.sample_size : number("--vae-tile", vae_tile);
    const int64_t least = 4 * pipeline.vae_scale();  // a tile of fewer than 4 latents decodes nothing useful
    KUAFU_CHECK(options.vae_tile >= least, "--vae-tile ", vae_tile, " is under ", least, " pixels (4 latents at the VAE's factor ",
                pipeline.vae_scale(), "); give a larger tile, or auto");
  }
  std::vector<torch::Tensor> images, initial, final;  // a row per seed: [B, 3, H, W], [B, C, h, w], [B, C, h, w]
  io::NamedTensors embeddings;  // the same for every seed: the first's
  for (const uint64_t seed : seeds) {
    options.seed = seed;
    const Samples samples = sample(pipeline, prompts, options);
    if (options.decode) images.push_back(samples.images);
    initial.push_back(samples.initial_latents.cpu());
    final.push_back(samples.latents.cpu());
    if (embeddings.empty()) {
      embeddings.emplace_back("prompt_embeds", samples.prompt_embeds.cpu());
      if (samples.negative_prompt_embeds.defined()) embeddings.emplace_back("negative_prompt_embeds", samples.negative_prompt_embeds.cpu());
    }
  }
  if (!latents_out.empty()) io::save_safetensors(latents_out, {{"latents", torch::cat(initial)}});
  if (!final_out.empty()) io::save_safetensors(final_out, {{"latents", torch::cat(final)}});
  if (!embeddings_out.empty()) io::save_safetensors(embeddings_out, embeddings);
  const int64_t columns = static_cast<int64_t>(prompts.size()) * options.images_per_prompt;
  if (!options.decode) {
    std::cout << final_out << ": the final latents of " << columns * static_cast<int64_t>(seeds.size()) << " image(s)\n";
    return;
  }
  std::vector<std::string> seed_names;
  for (const uint64_t seed : seeds) seed_names.push_back(std::to_string(seed));
  auto text = sample_png_text(prompts, latents_in.empty() ? text::join(seed_names, ", ") : "latents from " + latents_in, options);
  if (!init_image.empty()) text.emplace_back("init image", init_image);
  if (!mask.empty()) text.emplace_back("mask", mask);
  if (!lora_names.empty()) text.emplace_back("lora", text::join(lora_names, ", "));
  if (!concepts.empty()) text.emplace_back("embeddings", text::join(concepts, ", "));
  if (dtype != "fp32") text.emplace_back("dtype", dtype);
  text.insert(text.end(), {{"sampler", sampler_name.empty() ? pipeline.scheduler.class_name : sampler_name},
                           {"model", model},
                           {"software", "kuafu-sd"}});
  io::write_png(out, sample_grid(torch::cat(images), columns), text);
  std::cout << out << ": " << columns * static_cast<int64_t>(seeds.size()) << " image(s) of " << images[0].size(3) << "x"
            << images[0].size(2) << "\n";
}

}  // namespace

// Every failure, LibTorch's own included (a tensor too large to describe), is a message and exit code 1.
int run_sample(int argc, const char* const argv[]) {
  return train::run_app_command("kuafu-sd sample", [&] { sample_command(argc, argv); });
}

}  // namespace kuafu::sd

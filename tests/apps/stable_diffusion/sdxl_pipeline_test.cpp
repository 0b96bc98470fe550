// SDXL text-to-image sampling against diffusers' StableDiffusionXLPipeline (tests/python/diffusers_sdxl_reference.py)
// on a tiny random SDXL folder diffusers saved (two tokenizers, the second padding with "!", encoders of widths 16
// and 24, the second with its projection; a UNet with the text_time added conditioning): the same prompts at
// guidance 5 over 10 steps from the same non-square initial latents give diffusers' final latents and images under
// its Euler sampler (the folder's), with negative prompts, with guidance rescale, under DDIM, under Euler
// ancestral with its noise from the same seeded CPU generator, under Heun, UniPC, DPM-Solver++(2M) with Karras
// sigmas and Euler with them; and the prompt embeddings (both encoders' penultimate
// hidden states side by side, the second's projected pooled output, zeros without a negative prompt) are
// diffusers'. Float32, 1e-4 on latents and images (ten UNet passes; Euler's final latents reach 31, so this is 3e-6
// of them), 1e-5 on the embeddings (one encoder pass); DDIM's clipped run as its test says.
#include <gtest/gtest.h>

#include <iostream>

#include "apps/stable_diffusion/diffusion_loss.h"
#include "apps/stable_diffusion/lora_file.h"
#include "apps/stable_diffusion/pipeline.h"
#include "tests/support/devices.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/test_util.h"

namespace kuafu::sd {
namespace {

const testing::Reference& sdxl_reference() {
  static const testing::Reference r = testing::build_reference("diffusers_sdxl_reference.py", "sdxl_pipeline");
  return r;
}

const std::vector<std::string> kPrompts = {"a photo of the cat", "the cat!"};

SampleOptions sdxl_options() {
  SampleOptions options;
  options.steps = 10;
  options.guidance = 5.0;
  options.seed = 7;
  options.initial_latents = sdxl_reference()["initial_latents"];
  return options;
}

class SdxlPipelineTest : public ::testing::TestWithParam<std::string> {};

// Euler's run also on a GPU where one is visible: cuDNN's TF32 convolutions (LibTorch's default) turned off, so
// both sides are float32; the GPU sums in other orders, so its latents within 1e-3 (3e-5 of their largest).
TEST(SdxlPipelineTest, EveryDeviceSamplesAsDiffusers) {
  const testing::Reference& ref = sdxl_reference();
  at::globalContext().setAllowTF32CuDNN(false);
  for (const torch::Device& device : testing::devices_to_test()) {
    SCOPED_TRACE(device.str());
    Pipeline pipeline = load_pipeline((ref.dir / "pipe").string(), device);
    const Samples samples = sample(pipeline, kPrompts, sdxl_options());
    const double latents = testing::max_abs_difference(samples.latents.cpu(), ref["euler_latents"]);
    std::cout << "  " << device << ": latents within " << latents << " of diffusers'\n";
    EXPECT_LT(latents, device.is_cpu() ? 1e-4 : 1e-3);
    EXPECT_LT(testing::max_abs_difference(samples.images.cpu(), ref["euler_images"]), device.is_cpu() ? 1e-4 : 1e-3);
  }
}

// The tiny pipeline with the reference's kohya file `name` merged at weight 1 (expecting `layers` merged) samples
// Euler's latents within 1e-4 of the reference's `expected`, which the LoRA moved by more than 1.
void expect_kohya_file_samples_as(const std::string& name, int64_t layers, const std::string& expected) {
  const testing::Reference& ref = sdxl_reference();
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  EXPECT_EQ(merge_kohya_lora(pipeline, (ref.dir / name).string(), 1.0), layers);
  const Samples samples = sample(pipeline, kPrompts, sdxl_options());
  const double difference = testing::max_abs_difference(samples.latents, ref[expected]);
  std::cout << "  latents within " << difference << " of diffusers'\n";
  EXPECT_LT(difference, 1e-4);
  EXPECT_GT(testing::max_abs_difference(samples.latents, ref["euler_latents"]), 1.0) << "the LoRA moved the latents";
}

// PEFT's LoRA on the UNet and both text encoders, written as kohya's file by diffusers' convert_state_dict_to_kohya
// (lora_unet_*, lora_te1_*, lora_te2_*, alpha = r), merged by `sample --lora`'s merge, samples as diffusers' pipeline
// with PEFT's adapters active: its final latents within 1e-4 as above (the LoRA moves them by 6.0).
TEST(SdxlPipelineTest, AKohyaFileConvertedFromPeftSamplesAsThePeftAdaptedPipeline) {
  int64_t layers = 0, second_encoder = 0;
  for (const auto& [key, tensor] : io::load_safetensors((sdxl_reference().dir / "peft_kohya.safetensors").string()).tensors) {
    const bool down = key.find(".lora_down.weight") != std::string::npos;
    layers += down;
    second_encoder += down && key.rfind("lora_te2_", 0) == 0;
  }
  EXPECT_EQ(second_encoder, 3 * 4) << "the second encoder's 3 layers, 4 projections each";
  expect_kohya_file_samples_as("peft_kohya.safetensors", layers, "peft_kohya_latents");
}

// A kohya LoRA named as sd-scripts names SDXL's UNet layers, by the original model's blocks (input_blocks_3_1_proj_in,
// middle_block_2_out_layers_3, output_blocks_1_2_conv, time_embed_0, label_emb_0_0, out_2, ...: attention, LoCon
// convolutions in the ResNets, the samplers, the embeddings: 15 layers), merges into the layers diffusers'
// load_lora_weights maps them to and samples as diffusers' pipeline with it loaded (it moves the latents by 8.1).
TEST(SdxlPipelineTest, AKohyaFileInTheOriginalModelsNamesSamplesAsDiffusersLoadsIt) {
  expect_kohya_file_samples_as("sgm_kohya.safetensors", 15, "sgm_kohya_latents");
}

TEST_P(SdxlPipelineTest, SamplesAsDiffusersFromTheSameLatents) {
  const testing::Reference& ref = sdxl_reference();
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  ASSERT_TRUE(pipeline.sdxl());
  EXPECT_EQ(pipeline.scheduler.class_name, "EulerDiscreteScheduler");
  SampleOptions options = sdxl_options();
  const std::string run = GetParam();
  if (run == "negative") options.negative_prompts = {"blurry", "a dog"};
  if (run == "rescale") options.guidance_rescale = 0.7;
  const std::string kind = run.substr(0, run.find("_karras"));  // "dpm_karras": DPM++ 2M with Karras sigmas
  if (kind != "euler" && kind != "negative" && kind != "rescale") options.sampler = sampler_named(kind == "dpm" ? "dpm++2m" : kind);
  options.karras_sigmas = kind != run;
  const Samples samples = sample(pipeline, kPrompts, options);
  if (run == "ddim") {
    // DDIM from the folder's Euler config clips x̂₀ to [-1, 1] (diffusers' from_config gives DDIM its class default),
    // and this random model's clipped trajectory moves by float32's rounding alone: diffusers' own float32 run is
    // 2.6e-4 from its float64 run. Kuafu's must be as near the float64 run as 3 times that (measured 3.6e-4).
    const double float32_rounding = testing::max_abs_difference(ref["ddim_latents"], ref["ddim_float64_latents"]);
    EXPECT_GT(float32_rounding, 0.0);
    EXPECT_LT(testing::max_abs_difference(samples.latents, ref["ddim_float64_latents"]), 3 * float32_rounding);
    return;
  }
  EXPECT_LT(testing::max_abs_difference(samples.latents, ref[run + "_latents"]), 1e-4);
  if (run == "euler") {
    EXPECT_EQ(samples.images.sizes(), (std::vector<int64_t>{2, 3, 16, 24}));
    EXPECT_LT(testing::max_abs_difference(samples.images, ref["euler_images"]), 1e-4);
    EXPECT_LT(testing::max_abs_difference(samples.prompt_embeds, ref["prompt_embeds"]), 1e-5);
    EXPECT_LT(testing::max_abs_difference(samples.negative_prompt_embeds, ref["negative_prompt_embeds"]), 1e-5);
    EXPECT_EQ(samples.negative_prompt_embeds.abs().max().item<double>(), 0.0) << "no negative prompt: zeros";
  }
}

INSTANTIATE_TEST_SUITE_P(Runs, SdxlPipelineTest, ::testing::Values("euler", "negative", "rescale", "ddim", "euler_a", "heun", "unipc",
                                                                     "dpm_karras", "euler_karras"));

TEST(SdxlPipelineTest, PromptEmbeddingsAreBothEncodersAsDiffusersJoinsThem) {
  const testing::Reference& ref = sdxl_reference();
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  const PromptEmbeddings embedded = encode_prompts(pipeline, kPrompts);
  EXPECT_EQ(embedded.text.sizes(), (std::vector<int64_t>{2, 77, 40}));
  EXPECT_LT(testing::max_abs_difference(embedded.text, ref["prompt_embeds"]), 1e-5);
  EXPECT_LT(testing::max_abs_difference(embedded.pooled, ref["pooled_prompt_embeds"]), 1e-5);
  EXPECT_EQ(ref["negative_pooled_prompt_embeds"].abs().max().item<double>(), 0.0);
}

// train_text_to_image_sdxl.py's objective on two 16 x 24 images (original size = target size, no crop): the VAE's
// latents, both encoders' embeddings and the pooled text, then the loss and the gradients of seven UNet parameters
// (the added conditioning's embedding among them) equal diffusers' (float32: 1e-5 of the loss and of each
// gradient's largest entry, one UNet pass forward and back).
TEST(SdxlTrainingTest, TheObjectiveIsTrainTextToImageSdxls) {
  const testing::Reference& ref = sdxl_reference();
  Pipeline p = load_pipeline((ref.dir / "pipe").string());
  const auto posterior = p.vae->encode(ref["train_pixels"]);
  const torch::Tensor latents = posterior.sample(ref["train_posterior_noise"]) * p.vae->config.scaling_factor;
  EXPECT_LT(testing::max_abs_difference(latents, ref["train_latents"]), 1e-5);
  const PromptEmbeddings text = encode_prompts(p, {"a photo of the cat", ""});
  EXPECT_LT(testing::max_abs_difference(text.text, ref["train_text"]), 1e-5);
  EXPECT_LT(testing::max_abs_difference(text.pooled, ref["train_pooled"]), 1e-5);
  const NoiseSchedule schedule(p.scheduler.config);
  DiffusionInputs in{ref["train_latents"], ref["train_text"], ref["train_noise"], ref["train_timesteps"],
                     {ref["train_pooled"], sdxl_time_ids(2, 16, 24, torch::TensorOptions(torch::kFloat32))}};
  const torch::Tensor loss = diffusion_loss(p.unet, schedule, in);
  loss.backward();
  const double expected = ref["train_loss"].item<double>();
  EXPECT_NEAR(loss.item<double>(), expected, 1e-5 * expected);
  const auto params = p.unet->named_parameters();
  int64_t compared = 0;
  for (const auto& [name, want] : ref.outputs.file.tensors) {
    if (name.rfind("train_grad.", 0) != 0) continue;
    const std::string parameter = name.substr(std::string("train_grad.").size());
    ASSERT_TRUE(params.contains(parameter)) << parameter;
    EXPECT_LT(testing::max_abs_difference(params[parameter].grad(), want), 1e-5 * want.abs().max().item<double>()) << parameter;
    ++compared;
  }
  EXPECT_EQ(compared, 7);
}

// img2img as StableDiffusionXLImg2ImgPipeline (no aesthetic score: the time ids of the image's size) at strength 0.6
// under Euler, the image's latent sample and the noise drawn from the generator seeded 7 in diffusers' order:
// diffusers' latents, 1e-4 as above. Inpainting as StableDiffusionXLInpaintPipeline with the plain UNet (the known
// part put back after each step) at strength 1 and 0.6: diffusers' latents, 1e-4.
TEST(SdxlPipelineTest, Img2ImgAndInpaintingAsDiffusers) {
  const testing::Reference& ref = sdxl_reference();
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  SampleOptions options = sdxl_options();
  options.initial_latents = torch::Tensor();
  options.init_image = ref["init_image"];
  options.strength = 0.6;
  const Samples samples = sample(pipeline, kPrompts, options);
  EXPECT_LT(testing::max_abs_difference(samples.latents, ref["img2img_latents"]), 1e-4);
  options.mask_image = ref["mask_image"];
  for (const auto& [name, strength] : std::vector<std::pair<std::string, double>>{{"inpaint", 1.0}, {"inpaint_strength", 0.6}}) {
    options.strength = strength;
    EXPECT_LT(testing::max_abs_difference(sample(pipeline, kPrompts, options).latents, ref[name + "_latents"]), 1e-4) << name;
  }
  // The inpainting UNet (9 channels: the latents, the mask, the masked image's latents) in an SDXL inpainting folder,
  // whose model_index.json says requires_aesthetics_score = false.
  Pipeline inpainting = load_pipeline((ref.dir / "inpaint_pipe").string());
  ASSERT_EQ(inpainting.unet->config.in_channels, 9);
  for (const auto& [name, strength] : std::vector<std::pair<std::string, double>>{{"inpaint_unet", 1.0}, {"inpaint_unet_strength", 0.6}}) {
    options.strength = strength;
    const double difference = testing::max_abs_difference(sample(inpainting, kPrompts, options).latents, ref[name + "_latents"]);
    EXPECT_LT(difference, 1e-4) << name;
    std::cout << "SDXL inpainting UNet, " << name << ": latents within " << difference << "\n";
  }
}

}  // namespace
}  // namespace kuafu::sd

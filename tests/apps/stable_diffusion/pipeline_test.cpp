// Text-to-image sampling against diffusers' StableDiffusionPipeline (tests/python/diffusers_pipeline_reference.py)
// on a tiny pipeline folder diffusers saved (its tokenizer as transformers 5 writes it, a tokenizer.json
// alone): the same prompts at guidance 7.5 over 10 steps from the same initial latents give diffusers'
// final latents and images under DDIM, Euler discrete, Heun, DPM-Solver++(2M), UniPC (the last four also with Karras sigmas),
// Euler ancestral, and DDPM with their noise from the same seeded CPU generator. Float32, 1e-4 on latents and images of order 1 (ten UNet passes).
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>

#include "apps/stable_diffusion/lora_file.h"
#include "apps/stable_diffusion/pipeline.h"
#include "core/io/png_file.h"
#include "core/io/safetensors.h"
#include "core/util/atomic_file.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/run_command.h"
#include "tests/support/test_util.h"

namespace kuafu::sd {
namespace {

const testing::Reference& pipeline_reference() {
  static const testing::Reference r = testing::build_reference("diffusers_pipeline_reference.py", "sd_pipeline");
  return r;
}


class PipelineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineTest, SamplesAsDiffusersFromTheSameLatents) {
  const testing::Reference& ref = pipeline_reference();
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  EXPECT_EQ(pipeline.scheduler.class_name, "DDIMScheduler");
  SampleOptions options;
  options.steps = 10;
  options.guidance = 7.5;
  const std::string kind = GetParam().substr(0, GetParam().find("_karras"));  // "DPM++ 2M Karras": dpm++2m, Karras sigmas
  options.sampler = sampler_named(kind == "dpm" ? "dpm++2m" : kind);
  if (kind != GetParam()) options.karras_sigmas = true;
  options.seed = 7;
  options.initial_latents = ref["initial_latents"];
  const Samples samples = sample(pipeline, {"a photo of the cat", "the cat!"}, options);
  EXPECT_LT(testing::max_abs_difference(samples.latents, ref[GetParam() + "_latents"]), 1e-4);
  EXPECT_EQ(samples.images.sizes(), (std::vector<int64_t>{2, 3, 16, 16}));
  EXPECT_LT(testing::max_abs_difference(samples.images, ref[GetParam() + "_images"]), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Samplers, PipelineTest, ::testing::Values("ddim", "euler", "dpm", "ddpm", "euler_a", "heun", "unipc",
                                                                   "euler_karras", "dpm_karras", "heun_karras", "unipc_karras"));

// img2img (diffusers' StableDiffusionImg2ImgPipeline) from the same image at strength 0.6 over 10 steps: the VAE
// encodes the image, a sample of its latent distribution is noised to step 4 (Heun's call 8), and the last 6
// steps are taken; both draws and the stochastic samplers' noise from the generator seeded 7 in diffusers'
// order. Each sampler, and DDIM with two images per prompt (one image serving all four rows), gives diffusers'
// latents and images to 1e-4 as above; the image shows in the result (the same noise without it ends elsewhere).
class Img2ImgTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Img2ImgTest, SamplesAsDiffusersFromTheSameImage) {
  const testing::Reference& ref = pipeline_reference();
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  SampleOptions options;
  options.steps = 10;
  options.guidance = 7.5;
  const std::string kind = GetParam() == "ddim_per_prompt" ? "ddim" : GetParam();
  options.sampler = sampler_named(kind == "dpm" ? "dpm++2m" : kind);
  if (GetParam() == "ddim_per_prompt") options.images_per_prompt = 2;
  options.seed = 7;
  options.init_image = ref["init_image"];
  options.strength = 0.6;
  const Samples samples = sample(pipeline, {"a photo of the cat", "the cat!"}, options);
  const std::string key = "img2img_" + GetParam();
  const double latents = testing::max_abs_difference(samples.latents, ref[key + "_latents"]);
  const double images = testing::max_abs_difference(samples.images, ref[key + "_images"]);
  std::cout << "  " << key << ": latents " << latents << ", images " << images << " from diffusers'\n";
  EXPECT_LT(latents, 1e-4);
  EXPECT_LT(images, 1e-4);
  // The same draws without the image (its latents zero) end more than 0.1 away: the image is what was sampled from.
  SampleOptions blank = options;
  blank.init_image = torch::full_like(options.init_image, 0.5);
  EXPECT_GT(testing::max_abs_difference(sample(pipeline, {"a photo of the cat", "the cat!"}, blank).latents, samples.latents), 0.1);
}

INSTANTIATE_TEST_SUITE_P(Samplers, Img2ImgTest, ::testing::Values("ddim", "euler", "dpm", "ddpm", "euler_a", "heun", "unipc", "ddim_per_prompt"));

TEST(Img2ImgTest, BadImagesAndStrengthsAreNamed) {
  const testing::Reference& ref = pipeline_reference();
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  SampleOptions options;
  options.steps = 10;
  options.sampler = SamplerKind::kDdim;
  options.init_image = torch::rand({1, 3, 15, 16});
  std::string message = testing::error_message([&] { sample(pipeline, {"x"}, options); });
  EXPECT_NE(message.find("must divide by the VAE's factor 2"), std::string::npos) << message;
  options.init_image = torch::rand({1, 3, 16, 16});
  options.strength = 0.05;  // 10 steps x 0.05: none taken
  message = testing::error_message([&] { sample(pipeline, {"x"}, options); });
  EXPECT_NE(message.find("takes none of 10 steps"), std::string::npos) << message;
  options.strength = 1.5;
  message = testing::error_message([&] { sample(pipeline, {"x"}, options); });
  EXPECT_NE(message.find("is not in (0, 1]"), std::string::npos) << message;
}

// Inpainting (diffusers' StableDiffusionInpaintPipeline with a 9-channel UNet: the latents, the mask at their
// size, the latents of the image with the repainted part blanked) from the same image and mask (a rectangle):
// at strength 1 from pure noise under DDIM, Euler ancestral and DPM-Solver++(2M), at 0.6 from the noised image
// under DDIM, and with two images per prompt; and the legacy way with a 4-channel UNet (the known part put back
// after each step, noised to the next) under DDIM and Euler ancestral at strength 1 and DPM-Solver++(2M) at
// 0.6. Every draw from the generator seeded 7 in diffusers' order (the image's latents where used, the noise,
// the masked image's latents). diffusers' latents and images to 1e-4 as above.
torch::Tensor rectangle_mask() {
  torch::Tensor mask = torch::zeros({1, 1, 16, 16});
  mask.index_put_({0, 0, torch::indexing::Slice(3, 11), torch::indexing::Slice(5, 14)}, 1.0);  // mask.png's white
  return mask;
}

class InpaintTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InpaintTest, SamplesAsDiffusersFromTheSameImageAndMask) {
  const testing::Reference& ref = pipeline_reference();
  const std::string& run = GetParam();
  const bool plain = run.rfind("plain_", 0) == 0;  // the 4-channel UNet, the known part put back after each step
  Pipeline pipeline = load_pipeline((ref.dir / (plain ? "pipe" : "inpaint_pipe")).string());
  SampleOptions options;
  options.steps = 10;
  options.guidance = 7.5;
  const bool dpm = run.find("dpm") != std::string::npos, ancestral = run.find("euler_a") != std::string::npos;
  options.sampler = dpm ? SamplerKind::kDpmSolverPlusPlus2M : ancestral ? SamplerKind::kEulerAncestral : SamplerKind::kDdim;
  options.strength = run.find("strength") != std::string::npos ? 0.6 : 1.0;
  if (run == "ddim_per_prompt") options.images_per_prompt = 2;
  options.seed = 7;
  options.init_image = ref["init_image"];
  options.mask_image = rectangle_mask();
  const Samples samples = sample(pipeline, {"a photo of the cat", "the cat!"}, options);
  const std::string key = "inpaint_" + run;
  const double latents = testing::max_abs_difference(samples.latents, ref[key + "_latents"]);
  const double images = testing::max_abs_difference(samples.images, ref[key + "_images"]);
  std::cout << "  " << key << ": latents " << latents << ", images " << images << " from diffusers'\n";
  EXPECT_LT(latents, 1e-4);
  EXPECT_LT(images, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Runs, InpaintTest, ::testing::Values("ddim", "euler_a", "dpm", "ddim_strength", "ddim_per_prompt", "plain_ddim",
                                                              "plain_euler_a", "plain_dpm_strength"));

TEST(InpaintTest, AMaskNeedsAnImageOfItsSize) {
  const testing::Reference& ref = pipeline_reference();
  Pipeline inpainting = load_pipeline((ref.dir / "inpaint_pipe").string());
  SampleOptions options;
  options.steps = 2;
  options.sampler = SamplerKind::kDdim;
  options.mask_image = rectangle_mask();
  std::string message = testing::error_message([&] { sample(inpainting, {"x"}, options); });
  EXPECT_NE(message.find("needs the image it repaints"), std::string::npos) << message;
  options.init_image = ref["init_image"];
  options.mask_image = torch::ones({1, 1, 8, 16});
  message = testing::error_message([&] { sample(inpainting, {"x"}, options); });
  EXPECT_NE(message.find("at the image's size (16x16)"), std::string::npos) << message;
  options.mask_image = torch::Tensor();
  message = testing::error_message([&] { sample(inpainting, {"x"}, options); });
  EXPECT_NE(message.find("this UNet inpaints (in_channels 9)"), std::string::npos) << message;
}

// A LoRA in kohya's format (random, rank 2, alpha 3: attention projections, proj_in, the feed-forward's input,
// a ResNet's 3x3 convolution as LoCon) merged at weight 1 and 0.5 samples as diffusers' pipeline with the file
// loaded by load_lora_weights and set_adapters at that weight (DDIM from the same latents, 1e-4 as above).
TEST(KohyaLoraTest, MergedSamplesAsDiffusersLoadingIt) {
  const testing::Reference& ref = pipeline_reference();
  for (const auto& [name, weight] : {std::pair{std::string("kohya"), 1.0}, std::pair{std::string("kohya_half"), 0.5}}) {
    SCOPED_TRACE(name);
    Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
    EXPECT_EQ(merge_kohya_lora(pipeline, (ref.dir / "kohya_lora.safetensors").string(), weight), 7);
    SampleOptions options;
    options.steps = 10;
    options.guidance = 7.5;
    options.sampler = SamplerKind::kDdim;
    options.initial_latents = ref["initial_latents"];
    const Samples samples = sample(pipeline, {"a photo of the cat", "the cat!"}, options);
    const double latents = testing::max_abs_difference(samples.latents, ref[name + "_latents"]);
    std::cout << "  " << name << ": latents " << latents << " from diffusers'; " << testing::max_abs_difference(samples.latents, ref["ddim_latents"])
              << " from the pipeline's without it\n";
    EXPECT_LT(latents, 1e-4);
    EXPECT_LT(testing::max_abs_difference(samples.images, ref[name + "_images"]), 1e-4);
    EXPECT_GT(testing::max_abs_difference(samples.latents, ref["ddim_latents"]), 1e-2);
  }
}

// The text encoder's layers ("lora_te_text_model_...") merge by the formula W + w (alpha / r) up down, worked here
// from the weights before (diffusers' loader mis-reads kohya's text-encoder keys under transformers 5, so it is
// no reference for them); a layer the pipeline lacks, an adapter of the wrong shape and a file without LoRA keys
// are named.
TEST(KohyaLoraTest, TextEncoderLayersMergeByTheFormulaAndBadFilesAreNamed) {
  const testing::Reference& ref = pipeline_reference();
  const auto dir = testing::temp_dir("kohya_te");
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  torch::Tensor q_proj;  // the weight itself (a handle on its storage)
  for (const auto& item : pipeline.text_encoder->named_parameters())
    if (item.key() == "text_model.encoder.layers.1.self_attn.q_proj.weight") q_proj = item.value();
  ASSERT_TRUE(q_proj.defined());
  const torch::Tensor before = q_proj.detach().clone();  // [12, 12]
  const torch::Tensor down = torch::randn({3, 12}), up = torch::randn({12, 3});
  const std::string layer = "lora_te_text_model_encoder_layers_1_self_attn_q_proj";
  io::save_safetensors((dir / "te.safetensors").string(),
                       {{layer + ".lora_down.weight", down}, {layer + ".lora_up.weight", up}, {layer + ".alpha", torch::tensor(6.0)}});
  EXPECT_EQ(merge_kohya_lora(pipeline, (dir / "te.safetensors").string(), 0.25), 1);
  EXPECT_TRUE(torch::allclose(q_proj, before + 0.25 * (6.0 / 3.0) * torch::mm(up, down), 1e-6, 1e-6));

  io::save_safetensors((dir / "missing.safetensors").string(),
                       {{"lora_te_text_model_encoder_layers_7_self_attn_q_proj.lora_down.weight", down},
                        {"lora_te_text_model_encoder_layers_7_self_attn_q_proj.lora_up.weight", up}});
  std::string message = testing::error_message([&] { merge_kohya_lora(pipeline, (dir / "missing.safetensors").string(), 1.0); });
  EXPECT_NE(message.find("adapts a layer this pipeline does not have (lora_te_text_model_encoder_layers_7_self_attn_q_proj)"),
            std::string::npos) << message;
  io::save_safetensors((dir / "shape.safetensors").string(), {{layer + ".lora_down.weight", torch::randn({3, 5})}, {layer + ".lora_up.weight", up}});
  message = testing::error_message([&] { merge_kohya_lora(pipeline, (dir / "shape.safetensors").string(), 1.0); });
  EXPECT_NE(message.find("do not fit its weight"), std::string::npos) << message;
  io::save_safetensors((dir / "none.safetensors").string(), {{"unet.conv_in.lora_A.weight", down}});
  message = testing::error_message([&] { merge_kohya_lora(pipeline, (dir / "none.safetensors").string(), 1.0); });
  EXPECT_NE(message.find("no kohya LoRA key"), std::string::npos) << message;
  std::filesystem::remove_all(dir);
}

// Negative prompts (the unconditional rows' text, one per prompt), guidance rescale 0.7 (Lin et al.'s value)
// alone and with them, and DDIM's eta 0.5 (its noise from the generator seeded 7), under DDIM from the same
// latents: diffusers' latents and images, 1e-4 as above. Each changes the result (more than 1e-2 from plain
// guidance's), so each is checked.
TEST(PipelineTest, NegativePromptsGuidanceRescaleAndEtaSampleAsDiffusers) {
  const testing::Reference& ref = pipeline_reference();
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  for (const std::string name : {"ddim_negative", "ddim_rescale", "ddim_negative_rescale", "ddim_eta"}) {
    SCOPED_TRACE(name);
    SampleOptions options;
    options.steps = 10;
    options.guidance = 7.5;
    options.sampler = SamplerKind::kDdim;
    options.initial_latents = ref["initial_latents"];
    options.seed = 7;
    if (name == "ddim_negative" || name == "ddim_negative_rescale") options.negative_prompts = {"blurry", "a dog"};
    if (name == "ddim_rescale" || name == "ddim_negative_rescale") options.guidance_rescale = 0.7;
    if (name == "ddim_eta") options.eta = 0.5;
    const Samples samples = sample(pipeline, {"a photo of the cat", "the cat!"}, options);
    const double latents = testing::max_abs_difference(samples.latents, ref[name + "_latents"]);
    const double images = testing::max_abs_difference(samples.images, ref[name + "_images"]);
    const double effect = testing::max_abs_difference(ref[name + "_latents"], ref["ddim_latents"]);
    std::cout << "  " << name << ": latents " << latents << ", images " << images << " from diffusers'; " << effect
              << " from plain guidance's\n";
    EXPECT_LT(latents, 1e-4);
    EXPECT_LT(images, 1e-4);
    EXPECT_GT(effect, 1e-2);
  }
  SampleOptions mismatched;
  mismatched.negative_prompts = {"a", "b", "c"};
  const std::string message = testing::error_message([&] { sample(pipeline, {"x", "y"}, mismatched); });
  EXPECT_NE(message.find("3 negative prompts for 2 prompts"), std::string::npos) << message;
}

// Two images per prompt (diffusers' num_images_per_prompt): each prompt's rows next to each other, their
// initial noise drawn as one [4, 4, 8, 8] batch from the generator seeded 7 as the pipeline draws it; the
// latents and images equal diffusers' to 1e-4 as above, the text embeddings (and the empty caption's for the
// guidance) equal encode_prompt's to 1e-5 (a float32 CLIP of width 12), and without decoding the same latents
// come back with no images.
TEST(PipelineTest, ImagesPerPromptAndTheirEmbeddingsAsDiffusers) {
  const testing::Reference& ref = pipeline_reference();
  Pipeline pipeline = load_pipeline((ref.dir / "pipe").string());
  SampleOptions options;
  options.steps = 10;
  options.guidance = 7.5;
  options.sampler = SamplerKind::kDdim;
  options.seed = 7;
  options.images_per_prompt = 2;
  const Samples samples = sample(pipeline, {"a photo of the cat", "the cat!"}, options);
  EXPECT_LT(testing::max_abs_difference(samples.latents, ref["ddim_per_prompt_latents"]), 1e-4);
  EXPECT_LT(testing::max_abs_difference(samples.images, ref["ddim_per_prompt_images"]), 1e-4);
  EXPECT_LT(testing::max_abs_difference(samples.prompt_embeds, ref["prompt_embeds"]), 1e-5);
  EXPECT_LT(testing::max_abs_difference(samples.negative_prompt_embeds, ref["negative_prompt_embeds"]), 1e-5);
  EXPECT_GT(testing::max_abs_difference(samples.latents[0], samples.latents[1]), 1e-2) << "a prompt's two images are one";
  options.decode = false;
  const Samples latent_only = sample(pipeline, {"a photo of the cat", "the cat!"}, options);
  EXPECT_FALSE(latent_only.images.defined());
  EXPECT_TRUE(latent_only.latents.equal(samples.latents));
}

// A bf16 VAE (a bf16 run's frozen one) decodes in float32, as diffusers' force_upcast does: the images equal
// a float32 VAE's holding the same (bf16-rounded) weights, from the same latents, to float32's rounding
// (1e-6), while decoding in bf16 puts them 1e-3 or more off (measured: about 1e-2).
TEST(SampleTest, ABf16VaeDecodesInFloat32) {
  const testing::Reference& ref = pipeline_reference();
  SampleOptions options;
  options.steps = 4;
  options.sampler = SamplerKind::kDdim;
  options.initial_latents = ref["initial_latents"];
  Pipeline bf16 = load_pipeline((ref.dir / "pipe").string());
  bf16.vae->to(torch::kBFloat16);
  const Samples samples = sample(bf16, {"a photo of the cat", "the cat!"}, options);
  EXPECT_EQ(bf16.vae->decoder->conv_in->weight.scalar_type(), torch::kBFloat16) << "the pipeline's VAE stays as it was";
  Pipeline rounded = load_pipeline((ref.dir / "pipe").string());
  rounded.vae->to(torch::kBFloat16);
  rounded.vae->to(torch::kFloat32);
  const Samples expected = sample(rounded, {"a photo of the cat", "the cat!"}, options);
  EXPECT_LT(testing::max_abs_difference(samples.images, expected.images), 1e-6);
  torch::NoGradGuard no_grad;
  const torch::Tensor in_bf16 =
      (bf16.vae->decode((samples.latents / bf16.vae->config.scaling_factor).to(torch::kBFloat16)).to(torch::kFloat32) / 2 + 0.5).clamp(0, 1);
  EXPECT_GT(testing::max_abs_difference(in_bf16, expected.images), 1e-3) << "the check would not see a bf16 decoding";
}

TEST(PipelineFolderTest, AComponentItDoesNotHaveIsNamed) {
  nlohmann::json scheduler = {{"_class_name", "PNDMScheduler"}, {"beta_schedule", "scaled_linear"}, {"skip_prk_steps", true}};
  const SchedulerFolder pndm = read_scheduler_config(scheduler, "scheduler/scheduler_config.json");
  EXPECT_FALSE(pndm.sampler.has_value()) << "the schedule reads; the caller names a sampler";
  EXPECT_EQ(pndm.config.timestep_spacing, TimestepSpacing::kLeading);
  scheduler = {{"_class_name", "EulerDiscreteScheduler"}, {"use_karras_sigmas", true}};
  EXPECT_TRUE(read_scheduler_config(scheduler, "s.json").config.karras_sigmas);
  scheduler = {{"_class_name", "EulerDiscreteScheduler"}, {"use_karras_sigmas", true}, {"sigma_min", 0.1}};
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { read_scheduler_config(scheduler, "s.json"); }), "sigma_min = 0.1"));
  EXPECT_EQ(read_scheduler_config({{"_class_name", "EulerDiscreteScheduler"}}, "s.json").config.timestep_spacing, TimestepSpacing::kLinspace);

  const auto dir = testing::temp_dir("pipeline_extra");
  std::ofstream(dir / "model_index.json") << R"({"_class_name": "StableDiffusionPipeline", "controlnet": ["diffusers", "ControlNetModel"]})";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { load_pipeline(dir.string()); }), "component \"controlnet\""));

  // A component of another class is another model: named, not read as Kuafu's (it once went unnoticed).
  const auto other = testing::temp_dir("pipeline_other_unet");
  std::ofstream(other / "model_index.json") << R"({"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DModel"]})";
  const std::string error = testing::error_message([&] { load_pipeline(other.string()); });
  EXPECT_TRUE(testing::Contains(error, "unet is a UNet2DModel, which Kuafu does not compute (it reads UNet2DConditionModel)"));

  // SDXL's refiner conditions on an aesthetic score, which is not built: named before anything is read.
  const auto refiner = testing::temp_dir("pipeline_refiner");
  std::ofstream(refiner / "model_index.json") << R"({"_class_name": "StableDiffusionXLImg2ImgPipeline", "requires_aesthetics_score": true,
                                                     "text_encoder": [null, null], "unet": ["diffusers", "UNet2DConditionModel"]})";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { load_pipeline(refiner.string()); }), "requires_aesthetics_score = true"));
}

testing::CommandResult kuafu_sd(const std::string& args) { return testing::run_command(std::string(KUAFU_SD_PATH) + " " + args); }

// kuafu-sd sample through its command line: from the reference's initial latents the grid's pixels are
// diffusers' DDIM images as 8-bit values (±1: rounding), its text chunks say how it was made; a seeded
// run's --save-latents, given back as --latents, makes the same file; --output-latents and
// --output-embeddings write diffusers' latents and prompt embeddings; --images-per-prompt 2 makes diffusers'
// images as a row of four; bad input is named.
// bf16 and fp16 sampling (`--dtype`, diffusers' torch_dtype): the text encoder and the UNet in the dtype, the
// steps and the VAE in float32, under DDIM from the same latents rounded to the dtype. Neither can equal
// diffusers' run in the dtype, which also steps and decodes in it, so each is held to that run's own distance
// from the float32 result: no more than 1.5x as far (measured below), and not float32's (it computes in the
// dtype). The command gives the same latents and says the dtype; another dtype is refused by name.
TEST(PipelineTest, Bf16AndFp16SampleAsNearFloat32AsDiffusersDoes) {
  const testing::Reference& ref = pipeline_reference();
  const auto dir = testing::temp_dir("sd_dtype");
  for (const auto& [name, dtype] : {std::pair{std::string("bf16"), torch::kBFloat16}, std::pair{std::string("fp16"), torch::kFloat16}}) {
    SCOPED_TRACE(name);
    Pipeline pipeline = load_pipeline((ref.dir / "pipe").string(), torch::kCPU, PipelineLoad{dtype, dtype, torch::kFloat32});
    SampleOptions options;
    options.steps = 10;
    options.guidance = 7.5;
    options.sampler = SamplerKind::kDdim;
    options.initial_latents = ref["initial_latents"].to(dtype).to(torch::kFloat32);
    const Samples samples = sample(pipeline, {"a photo of the cat", "the cat!"}, options);
    const double ours = testing::max_abs_difference(samples.latents, ref["ddim_latents"]);
    const double theirs = testing::max_abs_difference(ref[name + "_latents"], ref["ddim_latents"]);
    const double between = testing::max_abs_difference(samples.latents, ref[name + "_latents"]);
    std::cout << "  " << name << ": Kuafu's latents " << ours << " from float32's, diffusers' " << theirs << ", the two " << between
              << " apart\n";
    EXPECT_GT(ours, 1e-4);
    EXPECT_LT(ours, 1.5 * theirs);

    io::save_safetensors((dir / "initial.safetensors").string(), {{"latents", options.initial_latents}});
    const std::string latents_out = (dir / (name + ".safetensors")).string();
    const testing::CommandResult run =
        kuafu_sd("sample --model " + (ref.dir / "pipe").string() + " --prompt 'a photo of the cat' --prompt 'the cat!' --steps 10 " +
                 "--sampler ddim --dtype " + name + " --latents " + (dir / "initial.safetensors").string() + " --output-latents " + latents_out);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_TRUE(io::load_safetensors(latents_out).find("latents")->equal(samples.latents));
  }
  const testing::CommandResult bad = kuafu_sd("sample --model x --prompt cat --out x.png --dtype fp64");
  EXPECT_TRUE(testing::Contains(bad.output, "--dtype fp64 is not fp32, bf16 or fp16")) << bad.output;
  std::filesystem::remove_all(dir);
}

// check_png: a grid Kuafu wrote against the reference's `key` images (SD 1.x's, or those in `reference_dir`),
// {"max_difference" in 8-bit values, "size"}.
nlohmann::json grid_against_reference(const std::filesystem::path& png, const std::string& key,
                                      const std::filesystem::path& reference_dir = pipeline_reference().dir) {
  const std::string reference = (reference_dir / "reference.safetensors").string();
  const testing::PythonRun check =
      testing::run_python_reference("diffusers_pipeline_reference.py", "check_png " + png.string() + " " + reference + " " + key);
  EXPECT_EQ(check.exit_code, 0) << check.output;
  return testing::last_json_line(check.output);
}

// `kuafu-sd sample --init-image` (and `--mask`) reads the PNGs diffusers' img2img and inpainting read with PIL and
// writes their images (±1/255: the PNG's 8 bits), with the strength, the image and the mask in the grid's text;
// `--lora FILE:0.5` samples as diffusers with the file loaded at 0.5; a file that is not an image is named.
TEST(SampleCommandTest, Img2ImgInpaintingAndKohyaLoraAsDiffusers) {
  const testing::Reference& ref = pipeline_reference();
  const auto dir = testing::temp_dir("sd_img2img");
  const std::string png = (ref.dir / "init.png").string();
  io::save_safetensors((dir / "initial.safetensors").string(), {{"latents", ref["initial_latents"]}});
  const std::string common = "sample --model " + (ref.dir / "pipe").string() + " --prompt 'a photo of the cat' --prompt 'the cat!' "
                             "--steps 10 --seed 7 --strength 0.6 --sampler euler_a";
  const testing::CommandResult run = kuafu_sd(common + " --init-image " + png + " --out " + (dir / "grid.png").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json line = grid_against_reference(dir / "grid.png", "img2img_euler_a_images");
  EXPECT_EQ(line["size"], (std::vector<int64_t>{16, 32, 3}));
  EXPECT_LE(line["max_difference"].get<int64_t>(), 1);
  const auto text = io::read_png_text((dir / "grid.png").string());
  const std::map<std::string, std::string> fields(text.begin(), text.end());
  EXPECT_EQ(fields.at("strength"), "0.6");
  EXPECT_EQ(fields.at("init image"), png);

  // Inpainting from the same PNG and mask.png, at diffusers' default strength for it (1).
  const testing::CommandResult inpaint =
      kuafu_sd("sample --model " + (ref.dir / "inpaint_pipe").string() + " --prompt 'a photo of the cat' --prompt 'the cat!' " +
               "--steps 10 --seed 7 --sampler ddim --init-image " + png + " --mask " + (ref.dir / "mask.png").string() + " --out " +
               (dir / "inpainted.png").string());
  ASSERT_EQ(inpaint.exit_code, 0) << inpaint.output;
  EXPECT_LE(grid_against_reference(dir / "inpainted.png", "inpaint_ddim_images")["max_difference"].get<int64_t>(), 1);
  const auto inpaint_text = io::read_png_text((dir / "inpainted.png").string());
  const std::map<std::string, std::string> inpaint_fields(inpaint_text.begin(), inpaint_text.end());
  EXPECT_EQ(inpaint_fields.at("mask"), (ref.dir / "mask.png").string());

  // A kohya LoRA at weight 0.5 from the command line, as diffusers' pipeline with it loaded at that weight.
  const testing::CommandResult lora =
      kuafu_sd("sample --model " + (ref.dir / "pipe").string() + " --prompt 'a photo of the cat' --prompt 'the cat!' --steps 10 " +
               "--sampler ddim --latents " + (dir / "initial.safetensors").string() + " --lora " + (ref.dir / "kohya_lora.safetensors").string() +
               ":0.5 --out " + (dir / "lora.png").string());
  ASSERT_EQ(lora.exit_code, 0) << lora.output;
  EXPECT_LE(grid_against_reference(dir / "lora.png", "kohya_half_images")["max_difference"].get<int64_t>(), 1);
  const auto lora_text = io::read_png_text((dir / "lora.png").string());
  const std::map<std::string, std::string> lora_fields(lora_text.begin(), lora_text.end());
  EXPECT_EQ(lora_fields.at("lora"), (ref.dir / "kohya_lora.safetensors").string() + ":0.5");

  write_file_atomic((dir / "not_an_image.png").string(), "text");
  const testing::CommandResult bad = kuafu_sd(common + " --init-image " + (dir / "not_an_image.png").string() + " --out " +
                                              (dir / "bad.png").string());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("not_an_image.png: not an 8-bit image"), std::string::npos) << bad.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.png"));
  std::filesystem::remove_all(dir);
}

TEST(SampleCommandTest, WritesDiffusersImagesAsAPngGridWithHowItWasMade) {
  const testing::Reference& ref = pipeline_reference();
  const auto dir = testing::temp_dir("sd_sample");
  io::save_safetensors((dir / "initial.safetensors").string(), {{"latents", ref["initial_latents"]}});
  const std::string common = "sample --model " + (ref.dir / "pipe").string() + " --prompt 'a photo of the cat' --prompt 'the cat!' --steps 10";
  const testing::CommandResult run = kuafu_sd(common + " --latents " + (dir / "initial.safetensors").string() + " --out " + (dir / "grid.png").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json line = grid_against_reference(dir / "grid.png", "ddim_images");
  EXPECT_EQ(line["size"], (std::vector<int64_t>{16, 32, 3}));
  EXPECT_LE(line["max_difference"].get<int64_t>(), 1);
  const auto text = io::read_png_text((dir / "grid.png").string());
  const std::map<std::string, std::string> fields(text.begin(), text.end());
  EXPECT_EQ(fields.at("prompt"), "a photo of the cat | the cat!");
  EXPECT_EQ(fields.at("steps"), "10");
  EXPECT_EQ(fields.at("guidance"), "7.5");
  EXPECT_EQ(fields.at("sampler"), "DDIMScheduler");

  ASSERT_EQ(kuafu_sd(common + " --seed 3 --sampler euler --save-latents " + (dir / "noise.safetensors").string() + " --out " +
                     (dir / "seeded.png").string()).exit_code, 0);
  ASSERT_EQ(kuafu_sd(common + " --sampler euler --latents " + (dir / "noise.safetensors").string() + " --out " +
                     (dir / "again.png").string()).exit_code, 0);
  const auto pixels = [](const std::filesystem::path& png) {  // the file less its text chunks, which name the seed
    const std::string bytes = read_file(png.string());
    return bytes.substr(bytes.find("IDAT"));
  };
  EXPECT_EQ(pixels(dir / "seeded.png"), pixels(dir / "again.png"));

  // A row per seed: seeds 3 and 5 give seed 3's row (the grid above) over seed 5's (sampled alone).
  ASSERT_EQ(kuafu_sd(common + " --seed 5 --sampler euler --out " + (dir / "five.png").string()).exit_code, 0);
  ASSERT_EQ(kuafu_sd(common + " --seed 3 --seed 5 --sampler euler --save-latents " + (dir / "both.safetensors").string() + " --out " +
                     (dir / "rows.png").string()).exit_code, 0);
  const testing::PythonRun stacked = testing::run_python_reference(
      "diffusers_pipeline_reference.py",
      "stacked_png " + (dir / "rows.png").string() + " " + (dir / "seeded.png").string() + " " + (dir / "five.png").string());
  ASSERT_EQ(stacked.exit_code, 0) << stacked.output;
  const nlohmann::json stacking = testing::last_json_line(stacked.output);
  EXPECT_EQ(stacking["size"], (std::vector<int64_t>{32, 32, 3}));
  EXPECT_TRUE(stacking["stacked"].get<bool>()) << stacked.output;
  EXPECT_EQ(io::load_safetensors((dir / "both.safetensors").string()).find("latents")->size(0), 4) << "two prompts, two seeds";
  const auto row_text = io::read_png_text((dir / "rows.png").string());
  const std::map<std::string, std::string> row_fields(row_text.begin(), row_text.end());
  EXPECT_EQ(row_fields.at("seed"), "3, 5");
  const testing::CommandResult seeds_and_latents =
      kuafu_sd(common + " --seed 3 --seed 5 --latents " + (dir / "noise.safetensors").string() + " --out x.png");
  EXPECT_EQ(seeds_and_latents.exit_code, 1);
  EXPECT_TRUE(testing::Contains(seeds_and_latents.output, "name at most one --seed")) << seeds_and_latents.output;

  // The final latents and the text embeddings as files, nothing decoded (no --out): diffusers' latents from
  // the same initial noise (1e-4) and encode_prompt's embeddings (its rows 0 and 2: one image per prompt, 1e-5).
  const testing::CommandResult latent = kuafu_sd(common + " --latents " + (dir / "initial.safetensors").string() +
                                                 " --output-latents " + (dir / "final.safetensors").string() +
                                                 " --output-embeddings " + (dir / "embeds.safetensors").string());
  ASSERT_EQ(latent.exit_code, 0) << latent.output;
  EXPECT_LT(testing::max_abs_difference(*io::load_safetensors((dir / "final.safetensors").string()).find("latents"),
                                        ref["ddim_latents"]),
            1e-4);
  const io::SafetensorsFile embeds = io::load_safetensors((dir / "embeds.safetensors").string());
  const torch::Tensor one_each = torch::tensor({0, 2});
  EXPECT_LT(testing::max_abs_difference(*embeds.find("prompt_embeds"), ref["prompt_embeds"].index_select(0, one_each)), 1e-5);
  EXPECT_LT(testing::max_abs_difference(*embeds.find("negative_prompt_embeds"),
                                        ref["negative_prompt_embeds"].index_select(0, one_each)),
            1e-5);
  // Two images per prompt: one row of four, the text chunk says so.
  ASSERT_EQ(kuafu_sd(common + " --seed 7 --images-per-prompt 2 --out " + (dir / "pairs.png").string()).exit_code, 0);
  const nlohmann::json pair_line = grid_against_reference(dir / "pairs.png", "ddim_per_prompt_images");
  EXPECT_EQ(pair_line["size"], (std::vector<int64_t>{16, 64, 3}));
  EXPECT_LE(pair_line["max_difference"].get<int64_t>(), 1);
  const auto pair_text = io::read_png_text((dir / "pairs.png").string());
  const std::map<std::string, std::string> pair_fields(pair_text.begin(), pair_text.end());
  EXPECT_EQ(pair_fields.at("images per prompt"), "2");
  const testing::CommandResult zero_images = kuafu_sd(common + " --images-per-prompt 0 --out x.png");
  EXPECT_TRUE(testing::Contains(zero_images.output, "--images-per-prompt 0 is not at least 1")) << zero_images.output;
  const testing::CommandResult no_out = kuafu_sd(common + " --output-embeddings " + (dir / "e.safetensors").string());
  EXPECT_TRUE(testing::Contains(no_out.output, "--out FILE.png is required (or --output-latents alone")) << no_out.output;

  const testing::CommandResult no_model = kuafu_sd("sample --prompt cat --out x.png");
  EXPECT_EQ(no_model.exit_code, 1);
  EXPECT_TRUE(testing::Contains(no_model.output, "--model DIR is required")) << no_model.output;
  const testing::CommandResult bad_sampler = kuafu_sd(common + " --sampler plms --out x.png");
  EXPECT_EQ(bad_sampler.exit_code, 1);
  EXPECT_TRUE(testing::Contains(bad_sampler.output, "sampler \"plms\" is not one of")) << bad_sampler.output;
  const testing::CommandResult bad_steps = kuafu_sd(common + " --steps ten --out x.png");
  EXPECT_TRUE(testing::Contains(bad_steps.output, "--steps ten is not a whole number")) << bad_steps.output;
}

// An SDXL folder (two encoders, non-square 16 x 24 px): `kuafu-sd sample` from diffusers' initial latents under the
// folder's Euler at guidance 5 writes diffusers' images (PIL reading the PNG, ±1/255: its 8 bits).
TEST(SampleCommandTest, AnSdxlFolderWritesDiffusersImages) {
  const testing::Reference sdxl = testing::build_reference("diffusers_sdxl_reference.py", "sdxl_pipeline");
  const auto dir = testing::temp_dir("sd_sample_sdxl");
  io::save_safetensors((dir / "initial.safetensors").string(), {{"latents", sdxl["initial_latents"]}});
  const testing::CommandResult run = kuafu_sd("sample --model " + (sdxl.dir / "pipe").string() +
                                              " --prompt 'a photo of the cat' --prompt 'the cat!' --steps 10 --guidance 5 --latents " +
                                              (dir / "initial.safetensors").string() + " --out " + (dir / "grid.png").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const nlohmann::json line = grid_against_reference(dir / "grid.png", "euler_images", sdxl.dir);
  EXPECT_EQ(line["size"], (std::vector<int64_t>{16, 48, 3}));
  EXPECT_LE(line["max_difference"].get<int64_t>(), 1);
  std::filesystem::remove_all(dir);
}

// A tile under 4 latents (0 once meant "whole" without a word), bad sampling options (Karras sigmas for
// DDIM among them) and an --out that is a folder are refused by name, and a failed write leaves nothing
// beside the folder.
TEST(SampleCommandTest, BadTilesAndOutputFoldersAreRefused) {
  const testing::Reference& ref = pipeline_reference();
  const auto dir = testing::temp_dir("sd_sample_refused");
  const std::string common = "sample --model " + (ref.dir / "pipe").string() + " --prompt cat --steps 2";
  for (const std::string tile : {"0", "-8", "4"}) {  // the VAE's factor is 2: 4 latents are 8 pixels
    const testing::CommandResult small = kuafu_sd(common + " --vae-tile " + tile + " --out " + (dir / "tiled.png").string());
    EXPECT_EQ(small.exit_code, 1) << tile;
    EXPECT_TRUE(testing::Contains(small.output, "--vae-tile " + tile + " is under 8 pixels")) << small.output;
  }
  const testing::CommandResult rescale = kuafu_sd(common + " --guidance-rescale 1.5 --out " + (dir / "r.png").string());
  EXPECT_EQ(rescale.exit_code, 1);
  EXPECT_TRUE(testing::Contains(rescale.output, "--guidance-rescale 1.5 is not in [0, 1]")) << rescale.output;
  const testing::CommandResult karras = kuafu_sd(common + " --karras-sigmas yes --out " + (dir / "k.png").string());
  EXPECT_EQ(karras.exit_code, 1);
  EXPECT_TRUE(testing::Contains(karras.output, "--karras-sigmas yes is not true or false")) << karras.output;
  const testing::CommandResult ddim_karras = kuafu_sd(common + " --sampler ddim --karras-sigmas true --out " + (dir / "k.png").string());
  EXPECT_EQ(ddim_karras.exit_code, 1);
  EXPECT_TRUE(testing::Contains(ddim_karras.output, "Karras sigmas are Euler's, Heun's, DPM-Solver++(2M)'s and UniPC's")) << ddim_karras.output;
  const testing::CommandResult negatives =
      kuafu_sd(common + " --negative-prompt a --negative-prompt b --out " + (dir / "n.png").string());
  EXPECT_EQ(negatives.exit_code, 1);
  EXPECT_TRUE(testing::Contains(negatives.output, "--negative-prompt given 2 times for 1 prompts")) << negatives.output;
  std::filesystem::create_directory(dir / "grid.png");
  const testing::CommandResult folder = kuafu_sd(common + " --out " + (dir / "grid.png").string());
  EXPECT_EQ(folder.exit_code, 1);
  EXPECT_TRUE(testing::Contains(folder.output, "grid.png is a folder")) << folder.output;
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"grid.png"});
}

// An image no machine could hold is refused before anything of its size is made, naming its size and the
// options to change (--width 1000000 once ran on without bound; 2^40 pixels once failed to allocate
// the noise with only the allocator's words). A tile bounds the decoder but not the UNet or the image.
TEST(SampleCommandTest, AnImageTooLargeForTheMachineIsRefusedBeforeSampling) {
  const testing::Reference& ref = pipeline_reference();
  const auto dir = testing::temp_dir("sd_sample_too_large");
  const std::string common = "sample --model " + (ref.dir / "pipe").string() + " --prompt cat --steps 2 --out " +
                             (dir / "huge.png").string();
  for (const std::string& size : {std::string("--width 1000000 --height 1000000"), std::string("--width 1099511627776")}) {
    const testing::CommandResult huge = kuafu_sd(common + " " + size);
    EXPECT_EQ(huge.exit_code, 1) << size;
    EXPECT_TRUE(testing::Contains(huge.output, "pixels needs at least")) << huge.output;
    EXPECT_TRUE(testing::Contains(huge.output, "--vae-tile")) << huge.output;
  }
  const testing::CommandResult tiled = kuafu_sd(common + " --width 1000000 --height 1000000 --vae-tile 64");
  EXPECT_EQ(tiled.exit_code, 1);
  EXPECT_TRUE(testing::Contains(tiled.output, "1000000x1000000 pixels needs at least")) << tiled.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "huge.png"));
}

}  // namespace
}  // namespace kuafu::sd

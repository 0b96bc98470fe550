// CLIP's prompts against transformers (tests/python/clip_reference.py) on a tiny CLIPTokenizer folder
// laid out as Stable Diffusion ships one: the 77 ids of AutoTokenizer(prompt, padding="max_length",
// max_length=77, truncation=True) exactly, for upper case, runs of whitespace, contractions, digits,
// accents and emoji, the special tokens written out, NFC and Unicode lower-casing, and a prompt cut at 77.
// And CLIP's text encoder (SD 1.x's quick GELU pooled at the highest id, SD 2.x's GELU pooled at the
// first end-of-text, SDXL's second encoder with its projection): a folder transformers saved gives its last
// hidden states, pooled (or projected) outputs and penultimate hidden states, and what Kuafu writes loads
// back in transformers with Kuafu's (float32, 1e-5: summation order).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "apps/stable_diffusion/clip_hugging_face.h"
#include "apps/stable_diffusion/prompt_tokens.h"
#include "core/util/atomic_file.h"
#include "tests/support/reference_outputs.h"

namespace kuafu::sd {
namespace {

const testing::Reference& clip_reference() {
  static const testing::Reference r = testing::build_reference("clip_reference.py", "sd_clip");
  return r;
}

TEST(ClipTokenizerTest, PromptsGiveTransformersIdsExactly) {
  const testing::Reference& ref = clip_reference();
  const PromptTokenizer tokenizer = PromptTokenizer::from_folder((ref.dir / "tokenizer").string());
  EXPECT_EQ(tokenizer.max_length(), 77);
  const nlohmann::json texts = nlohmann::json::parse(read_file((ref.dir / "texts.json").string()));
  ASSERT_GE(texts.size(), 7u);
  std::vector<std::string> prompts;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    prompts.push_back(text);
    const torch::Tensor expected = ref["ids_" + std::to_string(i)];
    EXPECT_EQ(tokenizer.encode(text), std::vector<int64_t>(expected.data_ptr<int64_t>(), expected.data_ptr<int64_t>() + expected.numel()))
        << text;
  }
  const torch::Tensor batch = tokenizer.encode(prompts);
  EXPECT_EQ(batch.sizes(), (std::vector<int64_t>{static_cast<int64_t>(prompts.size()), 77}));
  EXPECT_TRUE(batch[0].equal(ref["ids_0"]));
}

// SD 2.x's folders pad with "!": transformers then matches "!" whole as a special token ("!!" is two of
// them, not "!" and "!</w>"), and so does Kuafu; the padding is "!"'s id.
TEST(ClipTokenizerTest, APadTokenOfTheVocabularyIsSpecialAndPads) {
  const testing::Reference& ref = clip_reference();
  const PromptTokenizer tokenizer = PromptTokenizer::from_folder((ref.dir / "tokenizer_pad").string());
  const torch::Tensor expected = ref["pad_ids"];
  EXPECT_EQ(tokenizer.encode("wow!! the"), std::vector<int64_t>(expected.data_ptr<int64_t>(), expected.data_ptr<int64_t>() + expected.numel()));
  EXPECT_EQ(tokenizer.encode("wow!! the").back(), *tokenizer.bpe().token_id("!"));
}

// Decoding turns each word end into a space and trims, as transformers' CLIPTokenizer decodes.
TEST(ClipTokenizerTest, DecodingEndsWordsWithSpaces) {
  const PromptTokenizer tokenizer = PromptTokenizer::from_folder((clip_reference().dir / "tokenizer").string());
  EXPECT_EQ(tokenizer.bpe().decode(tokenizer.bpe().encode("A photo of the Cat!!")), "a photo of the cat !!");
}

TEST(ClipTokenizerTest, AFolderThatIsNoClipTokenizerIsNamed) {
  const auto dir = testing::temp_dir("not_clip");
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { PromptTokenizer::from_folder(dir.string()); }), "tokenizer_config.json"));
  std::ofstream(dir / "tokenizer_config.json") << R"({"tokenizer_class": "GPT2Tokenizer"})";
  EXPECT_TRUE(testing::Contains(testing::error_message([&] { PromptTokenizer::from_folder(dir.string()); }), "is not CLIPTokenizer"));
}


class ClipTextModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ClipTextModelTest, AFolderGivesTransformersOutputsAndKuafusLoadsBack) {
  const testing::Reference& ref = clip_reference();
  ClipTextModel model = clip_text_format().load((ref.dir / GetParam()).string());
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = ref["text_ids"];
  const bool projection = GetParam() == "text_projection";
  EXPECT_EQ(model->config.with_projection, projection);
  // The pooled output SD reads: the projected one where the encoder has the projection (SDXL's second).
  const auto pooled = [projection](const ClipTextModelImpl::Output& o) { return projection ? o.text_embeds : o.pooled; };
  const ClipTextModelImpl::Output out = model->forward(ids);
  EXPECT_LT(testing::max_abs_difference(out.last_hidden, ref[GetParam() + "_hidden"]), 1e-5);
  EXPECT_LT(testing::max_abs_difference(pooled(out), ref[GetParam() + "_pooled"]), 1e-5);
  EXPECT_LT(testing::max_abs_difference(out.penultimate, ref[GetParam() + "_penultimate"]), 1e-5);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  EXPECT_EQ(model->config.parameter_count(), parameters);

  for (auto& p : model->parameters()) p.mul_(0.9);  // Kuafu's own weights, not the folder's
  const auto dir = testing::temp_dir("clip_export_" + GetParam());
  std::filesystem::remove_all(dir);
  save_clip_text_model(model, dir.string());
  const ClipTextModelImpl::Output ours = model->forward(ids);
  const std::string expected = dir.string() + "_expected.safetensors";
  io::save_safetensors(expected, {{"ids", ids}, {"hidden", ours.last_hidden}, {"pooled", pooled(ours)}, {"penultimate", ours.penultimate}});
  const testing::PythonRun run = testing::run_python_reference("clip_reference.py", "check_text " + dir.string() + " " + expected);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_LT(testing::last_json_line(run.output)["max_difference"].get<double>(), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Activations, ClipTextModelTest, ::testing::Values("text_quick_gelu", "text_gelu", "text_projection"));

}  // namespace
}  // namespace kuafu::sd

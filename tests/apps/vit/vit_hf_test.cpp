// ViT and Hugging Face folders against transformers (tests/python/vit_reference.py builds a tiny random
// ViTForImageClassification with random LayerNorms, biases and class token; nothing is downloaded):
// the folder gives transformers' logits, loss and gradients; a backbone-only folder starts a fine-tune
// with a fresh classifier; what Kuafu exports loads in transformers with Kuafu's logits and class names.
#include <gtest/gtest.h>

#include <filesystem>

#include "apps/vit/hugging_face.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/test_util.h"

namespace kuafu::vit {
namespace {
namespace fs = std::filesystem;

// Float32 on both sides; here the same kernels run in the same order (measured: logits, loss and the
// export's logits identical). 1e-5 allows another machine's kernels their rounding and still catches
// a wrong tensor or a missing norm (those move logits of order 1 by 1e-2 or more).
constexpr double kTolerance = 1e-5;

using testing::Reference;

Reference build_reference(const std::string& name) { return testing::build_reference("vit_reference.py", name); }

TEST(ViTHuggingFaceTest, AFolderSavedByTransformersGivesItsOutputs) {
  const Reference r = build_reference("vit_reference");
  ViTForImageClassification model = vit_format().load((r.dir / "hf").string());
  model->eval();
  EXPECT_EQ(model->config.num_labels, 5);
  const torch::Tensor logits = model->forward(r["pixels"]);
  EXPECT_LT((logits - r["logits"]).abs().max().item<double>(), kTolerance);
  torch::Tensor loss = model->loss(r["pixels"], smoothed_targets(r["labels"], 5, 0.0));
  EXPECT_NEAR(loss.item<double>(), r["loss"].item<double>(), kTolerance);
  model->zero_grad();
  loss.backward();
  int compared = 0;
  for (const auto& p : model->named_parameters()) {
    const torch::Tensor* expected = r.outputs.file.find("grad." + p.key());
    if (!expected) continue;
    ++compared;
    EXPECT_TRUE(torch::allclose(p.value().grad(), *expected, 1e-4, 1e-6))
        << p.key() << ": largest gradient difference " << (p.value().grad() - *expected).abs().max().item<double>();
  }
  EXPECT_EQ(compared, 5);
}

TEST(ViTHuggingFaceTest, ABackboneStartsAFineTuneWithAFreshClassifier) {
  const Reference r = build_reference("vit_backbone");
  const io::HfFolder backbone = io::read_hf_folder((r.dir / "backbone").string());
  ViTConfig c = vit_format().read_config(io::read_hf_folder((r.dir / "hf").string()).config, "hf/config.json");
  c.num_labels = 3;  // a new task
  torch::manual_seed(2);
  ViTForImageClassification model(c);
  const torch::Tensor initial_head = model->classifier.ptr()->parameters()[0].detach().clone();
  const std::string refused = testing::error_message([&] { load_hf_weights(model, backbone); });
  EXPECT_TRUE(testing::Contains(refused, "lacks 2 of the model's tensors: 'classifier.bias', 'classifier.weight'")) << refused;
  load_hf_weights(model, backbone, /*fresh_classifier=*/true);
  EXPECT_TRUE(torch::equal(model->classifier.ptr()->parameters()[0], initial_head));
  const io::HfFolder full = io::read_hf_folder((r.dir / "hf").string());
  EXPECT_TRUE(torch::equal(model->vit->embeddings->cls_token, full.find("vit.embeddings.cls_token")->read()));
}

TEST(ViTHuggingFaceTest, WhatKuafuExportsLoadsInTransformersWithKuafusLogits) {
  const Reference r = build_reference("vit_export");
  ViTForImageClassification model = vit_format().load((r.dir / "hf").string());
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(5);
    for (auto& p : model->parameters()) p.add_(0.05 * torch::randn_like(p));
  }
  model->eval();
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = model->forward(r["pixels"]);
  }
  const fs::path expected = r.dir / "kuafu_logits.safetensors";
  io::save_safetensors(expected.string(), {{"pixels", r["pixels"]}, {"logits", logits}});
  const fs::path out = r.dir / "export";
  export_hf_vit(model, out.string(), {"ant", "bee", "cat", "dog", "eel"});
  const testing::PythonRun check = testing::run_python_reference("vit_reference.py", "check " + out.string() + " " + expected.string());
  ASSERT_EQ(check.exit_code, 0) << check.output;
  const nlohmann::json result = testing::last_json_line(check.output);
  EXPECT_LT(result["max_abs_diff"].get<double>(), kTolerance) << check.output;
  EXPECT_EQ(result["labels"]["3"], "dog") << check.output;
  // And back into Kuafu, bit for bit.
  ViTForImageClassification reloaded = vit_format().load(out.string());
  const auto mine = train::named_weights(*model), theirs = train::named_weights(*reloaded);
  ASSERT_EQ(mine.size(), theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(torch::equal(mine[i].second, theirs[i].second)) << mine[i].first;
}

}  // namespace
}  // namespace kuafu::vit

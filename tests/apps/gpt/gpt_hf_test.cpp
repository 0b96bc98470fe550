// GPT-2 and Hugging Face folders. Against transformers (tests/python/gpt2_reference.py builds a tiny
// random GPT2LMHeadModel with random LayerNorms and biases and saves it; nothing is downloaded): the
// folder loads, one file or sharded, and gives transformers' logits on a left-padded batch, its loss,
// its gradients and its greedy tokens; what Kuafu exports loads in transformers with Kuafu's logits.
// Bad folders are refused with the file and tensor named, and an export never overwrites a folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "apps/gpt/hugging_face.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/test_util.h"

namespace kuafu::gpt {
namespace {
namespace fs = std::filesystem;

// Float32 on both sides, the same maths in another summation order (fused vs separate kernels): the
// differences are rounding (measured: 9e-8 on the logits, 5e-7 on the loss, 3e-7 after the export);
// 1e-5 leaves room and still catches a wrong position, mask or tensor (those move logits by 1e-2 or more).
constexpr double kTolerance = 1e-5;

using testing::Reference;

Reference build_reference(const std::string& name) { return testing::build_reference("gpt2_reference.py", name); }

using testing::max_difference_on_real_tokens;

torch::Tensor padded_logits(GPT& model, const Reference& r) { return testing::padded_logits(model, r["ids"], r["mask"]); }

TEST(GPTHuggingFaceTest, AFolderSavedByTransformersGivesItsOutputs) {
  const Reference r = build_reference("gpt2_reference");
  for (const char* folder : {"hf", "hf_sharded"}) {
    SCOPED_TRACE(folder);
    GPT model = gpt_format().load((r.dir / folder).string());
    model->eval();
    EXPECT_EQ(model->config.vocab_size, 97);
    EXPECT_EQ(model->config.n_layer, 2);
    EXPECT_LT(max_difference_on_real_tokens(padded_logits(model, r), r["logits"], r["mask"]), kTolerance);

    // Loss and gradients of an unpadded batch (transformers shifts the labels inside).
    const torch::Tensor tokens = r["tokens"];
    const int64_t t = tokens.size(1);
    torch::Tensor loss = model->loss(tokens.narrow(1, 0, t - 1), tokens.narrow(1, 1, t - 1));
    EXPECT_NEAR(loss.item<double>(), r["loss"].item<double>(), kTolerance);
    model->zero_grad();
    loss.backward();
    for (const auto& p : model->named_parameters()) {
      const torch::Tensor* expected = r.outputs.file.find("grad." + p.key());
      if (!expected) continue;
      EXPECT_TRUE(torch::allclose(p.value().grad(), *expected, 1e-4, 1e-6))
          << p.key() << ": largest gradient difference " << (p.value().grad() - *expected).abs().max().item<double>();
    }

    // Greedy generation from the left-padded prompts gives transformers' tokens.
    nn::SamplingOptions greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = r["generated"].size(1);
    EXPECT_EQ(nn::generate(decoder(model), testing::prompts_of(r["ids"], r["mask"]), greedy), testing::rows_of(r["generated"]));
  }
}

TEST(GPTHuggingFaceTest, WhatKuafuExportsLoadsInTransformersWithKuafusLogits) {
  const Reference r = build_reference("gpt2_export");
  GPT model = gpt_format().load((r.dir / "hf").string());
  {
    // Weights of Kuafu's own (as after fine-tuning), not those transformers wrote.
    torch::NoGradGuard no_grad;
    torch::manual_seed(5);
    for (auto& p : model->parameters()) p.add_(0.05 * torch::randn_like(p));
  }
  model->eval();
  const torch::Tensor logits = padded_logits(model, r);
  const fs::path expected = r.dir / "kuafu_logits.safetensors";
  io::save_safetensors(expected.string(), {{"ids", r["ids"]}, {"mask", r["mask"]}, {"logits", logits}});

  io::HfWriteOptions sharded;
  sharded.max_shard_bytes = 20000;  // the 118 kB model in several files plus the index
  for (const auto& [name, options] : {std::pair<std::string, io::HfWriteOptions>{"export", {}}, {"export_sharded", sharded}}) {
    SCOPED_TRACE(name);
    const fs::path out = r.dir / name;
    gpt_format().save(model, out.string(), options);
    EXPECT_EQ(fs::exists(out / "model.safetensors.index.json"), name == "export_sharded");
    // Read back by Kuafu: the same tensors, bit for bit.
    GPT reloaded = gpt_format().load(out.string());
    const auto mine = train::named_weights(*model);
    const auto theirs = train::named_weights(*reloaded);
    ASSERT_EQ(mine.size(), theirs.size());
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(torch::equal(mine[i].second, theirs[i].second)) << mine[i].first;
    // Read by transformers: Kuafu's logits.
    const testing::PythonRun check =
        testing::run_python_reference("gpt2_reference.py", "check " + out.string() + " " + expected.string());
    ASSERT_EQ(check.exit_code, 0) << check.output;
    const nlohmann::json result = testing::last_json_line(check.output);
    EXPECT_LT(result["max_abs_diff"].get<double>(), kTolerance) << check.output;
    EXPECT_EQ(result["parameters"].get<int64_t>(), model->config.parameter_count());
  }
}

// A folder of `tensors` (and `config`) next to the good one, as a user's damaged download would be.
fs::path variant(const fs::path& root, const std::string& name, const nlohmann::json& config, const io::NamedTensors& tensors) {
  const fs::path dir = root / name;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump();
  io::save_safetensors((dir / "model.safetensors").string(), tensors);
  return dir;
}

std::string load_error(const fs::path& dir) {
  return testing::error_message([&] { gpt_format().load(dir.string()); });
}

TEST(GPTHuggingFaceTest, BadFoldersAreRefusedNamingTheFileAndTensor) {
  const fs::path root = testing::temp_dir("gpt_hf_bad");
  GPTConfig c;
  c.vocab_size = 40, c.n_positions = 16, c.n_embd = 16, c.n_layer = 2, c.n_head = 2;
  torch::manual_seed(1);
  GPT model(c);
  const nlohmann::json config = gpt_format().write_config(c);
  io::NamedTensors tensors;
  for (const auto& [name, t] : train::named_weights(*model)) tensors.emplace_back(name, t.detach().clone());
  auto without = [&](const std::string& dropped) {
    io::NamedTensors kept;
    for (const auto& item : tensors) if (item.first != dropped) kept.push_back(item);
    return kept;
  };
  auto with = [&](const std::string& name, const torch::Tensor& t) {
    io::NamedTensors changed = without(name);
    changed.emplace_back(name, t);
    return changed;
  };

  std::string e = load_error(variant(root, "missing", config, without("transformer.ln_f.bias")));
  EXPECT_TRUE(testing::Contains(e, "lacks 1 of the model's tensors: 'transformer.ln_f.bias'")) << e;
  e = load_error(variant(root, "extra", config, with("transformer.h.7.ln_1.weight", torch::ones({16}))));
  EXPECT_TRUE(testing::Contains(e, "extra/model.safetensors: tensor 'transformer.h.7.ln_1.weight' is not part of this model")) << e;
  e = load_error(variant(root, "shape", config, with("transformer.wpe.weight", torch::zeros({8, 16}))));
  EXPECT_TRUE(testing::Contains(e, "shape/model.safetensors: tensor 'transformer.wpe.weight' has shape [8, 16]")) << e;
  e = load_error(variant(root, "integer", config, with("transformer.wpe.weight", torch::zeros({16, 16}, torch::kInt64))));
  EXPECT_TRUE(testing::Contains(e, "tensor 'transformer.wpe.weight' is stored as I64 but expected F32")) << e;
  nlohmann::json opt = config;
  opt["model_type"] = "opt";
  e = load_error(variant(root, "type", opt, tensors));
  EXPECT_TRUE(testing::Contains(e, "type/config.json: model_type \"opt\" is not GPT-2")) << e;
  nlohmann::json relu = config;
  relu["activation_function"] = "relu";
  EXPECT_TRUE(testing::Contains(load_error(variant(root, "relu", relu, tensors)), "activation_function \"relu\""));
  nlohmann::json no_layers = config;
  no_layers.erase("n_layer");
  EXPECT_TRUE(testing::Contains(load_error(variant(root, "no_layers", no_layers, tensors)), "\"n_layer\" is missing"));
  const fs::path truncated = variant(root, "truncated", config, tensors);
  fs::resize_file(truncated / "model.safetensors", 100);
  EXPECT_TRUE(testing::Contains(load_error(truncated), "truncated/model.safetensors"));
  const fs::path untied = variant(root, "untied", config, with("lm_head.weight", torch::zeros({40, 16})));
  EXPECT_TRUE(testing::Contains(load_error(untied), "lm_head.weight differs from transformer.wte.weight"));
  const fs::path pickle = root / "pickle";
  fs::create_directories(pickle);
  std::ofstream(pickle / "config.json") << config.dump();
  std::ofstream(pickle / "pytorch_model.bin") << "not read";
  EXPECT_TRUE(testing::Contains(load_error(pickle), "PyTorch pickles"));
  EXPECT_TRUE(testing::Contains(load_error(root / "nowhere"), "nowhere does not exist"));

  // A sharded folder that lost a shard names it.
  io::HfWriteOptions small;
  small.max_shard_bytes = 4096;
  gpt_format().save(model, (root / "sharded").string(), small);
  std::string second;
  for (const auto& entry : fs::directory_iterator(root / "sharded")) {
    if (entry.path().filename().string().rfind("model-00002-of-", 0) == 0) second = entry.path().filename().string();
  }
  ASSERT_FALSE(second.empty()) << "the export made no second shard";
  fs::remove(root / "sharded" / second);
  EXPECT_TRUE(testing::Contains(load_error(root / "sharded"), "names shard " + second));

  // An export never replaces a folder: the one there keeps its contents.
  e = testing::error_message([&] { gpt_format().save(model, (root / "missing").string()); });
  EXPECT_TRUE(testing::Contains(e, "already exists")) << e;
  EXPECT_EQ(io::load_safetensors((root / "missing/model.safetensors").string()).tensors.size(), tensors.size() - 1);

  // Accepted: half-precision weights (converted), a bare GPT2Model's names, a head stored as a copy.
  io::NamedTensors half, bare;
  for (const auto& [name, t] : tensors) {
    half.emplace_back(name, t.to(torch::kBFloat16));
    bare.emplace_back(name.substr(std::string("transformer.").size()), t);
  }
  GPT from_half = gpt_format().load(variant(root, "bf16", config, half).string());
  EXPECT_TRUE(torch::equal(from_half->transformer->blocks[1]->parameters()[0],
                           model->transformer->blocks[1]->parameters()[0].to(torch::kBFloat16).to(torch::kFloat32)));
  GPT from_bare = gpt_format().load(variant(root, "bare", config, bare).string());
  EXPECT_TRUE(torch::equal(from_bare->transformer->ln_f.ptr()->parameters()[0], model->transformer->ln_f.ptr()->parameters()[0]));
  torch::Tensor wte;
  for (const auto& [name, t] : tensors) if (name == "transformer.wte.weight") wte = t;
  EXPECT_NO_THROW(gpt_format().load(variant(root, "tied_copy", config, with("lm_head.weight", wte.clone())).string()));
  fs::remove_all(root);
}

}  // namespace
}  // namespace kuafu::gpt

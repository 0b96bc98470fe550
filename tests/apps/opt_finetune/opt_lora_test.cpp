// LoRA (core/nn/lora.h, core/train/peft_adapter.h) on OPT and GPT-2: at initialisation the adapted model
// gives the base model's outputs; only the adapters train, also with activation checkpointing; the
// merged weights give the adapted model's logits, in OPT's [out, in] layout and GPT-2's Conv1D [in, out]
// with its fused c_attn; PEFT loads the adapter folder Kuafu writes, and Kuafu loads one PEFT writes,
// both giving the other's logits (tests/python/opt_reference.py, PeftModel; nothing downloaded).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "apps/gpt/model.h"
#include "apps/opt_finetune/hugging_face.h"
#include "core/memory/activation_checkpoint.h"
#include "core/nn/lora.h"
#include "core/train/checkpoint.h"
#include "core/train/peft_adapter.h"
#include "tests/support/reference_outputs.h"
#include "tests/support/test_util.h"

namespace kuafu::opt {
namespace {
namespace fs = std::filesystem;

// Float32 on both sides, the same maths in another order (see opt_hf_test.cpp).
constexpr double kLoraTolerance = 1e-5;

OPTConfig tiny_config() {
  OPTConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.ffn_dim = 32;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 24;
  c.word_embed_proj_dim = 16;
  c.dropout = 0.0;
  return c;
}

// B starts at zero; random values make the adapters change the outputs.
void randomize_adapters(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(9);
  for (auto& p : model.named_parameters()) {
    if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0.0, 0.2);
  }
}

torch::Tensor tokens_of(int64_t vocab) {
  torch::manual_seed(4);
  return torch::randint(vocab, {3, 9});
}

TEST(LoraTest, StartsAsTheBaseModelAndTrainsOnlyTheAdapters) {
  torch::manual_seed(1);
  OPTForCausalLM model(tiny_config());
  const torch::Tensor tokens = tokens_of(40);
  const torch::Tensor before = model->forward(tokens).detach();
  nn::LoraSpec spec;
  spec.rank = 4;
  const std::vector<std::string> adapted = nn::apply_lora(*model, spec);
  EXPECT_EQ(adapted, (std::vector<std::string>{"model.decoder.layers.0.self_attn.q_proj", "model.decoder.layers.0.self_attn.v_proj",
                                               "model.decoder.layers.1.self_attn.q_proj", "model.decoder.layers.1.self_attn.v_proj"}));
  EXPECT_TRUE(torch::equal(model->forward(tokens), before)) << "B = 0: the adapted model starts as the base";

  int64_t trainable = 0;
  for (const auto& p : model->named_parameters()) {
    EXPECT_EQ(p.value().requires_grad(), nn::is_lora_parameter(p.key())) << p.key();
    if (p.value().requires_grad()) trainable += p.value().numel();
  }
  EXPECT_EQ(trainable, 4 * (4 * 16 + 16 * 4));

  // One SGD step: B's gradient is non-zero, A's is zero (it is multiplied by B = 0), the base has none.
  const io::NamedTensors start = train::named_weights(*model);
  std::vector<torch::Tensor> copies;
  for (const auto& [name, t] : start) copies.push_back(t.detach().clone());
  model->loss(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8)).backward();
  for (const auto& p : model->named_parameters()) {
    if (!nn::is_lora_parameter(p.key())) {
      EXPECT_FALSE(p.value().grad().defined()) << p.key();
    } else if (p.key().find("lora_B") != std::string::npos) {
      EXPECT_GT(p.value().grad().abs().max().item<double>(), 0) << p.key();
    } else {
      EXPECT_EQ(p.value().grad().abs().max().item<double>(), 0) << p.key();
    }
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      if (p.grad().defined()) p.sub_(0.1 * p.grad());
    }
  }
  const io::NamedTensors after = train::named_weights(*model);
  for (size_t i = 0; i < after.size(); ++i) {
    const bool changed = !torch::equal(after[i].second, copies[i]);
    EXPECT_EQ(changed, after[i].first.find("lora_B") != std::string::npos) << after[i].first;
  }
}

// Checkpointed blocks run forward without a graph and recompute in backward: the adapters inside must
// still get their gradients although no input of the block needs one (the embeddings are frozen).
TEST(LoraTest, AdaptersTrainThroughCheckpointedBlocks) {
  torch::manual_seed(2);
  OPTForCausalLM model(tiny_config());
  nn::apply_lora(*model, nn::LoraSpec{});
  randomize_adapters(*model);
  const torch::Tensor tokens = tokens_of(40);
  const torch::Tensor inputs = tokens.narrow(1, 0, 8), targets = tokens.narrow(1, 1, 8);
  auto gradients = [&](bool checkpoint) {
    model->zero_grad();
    torch::Tensor x = model->head(inputs);
    for (int64_t i = 0; i < model->num_blocks(); ++i) {
      x = checkpoint ? memory::checkpointed(x, [&, i](const torch::Tensor& h) { return model->block(i, h, {}); })
                     : model->block(i, x, {});
    }
    model->tail_loss(x, targets).backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& p : model->named_parameters()) {
      if (p.value().grad().defined()) grads[p.key()] = p.value().grad().clone();
    }
    return grads;
  };
  const auto plain = gradients(false), recomputed = gradients(true);
  ASSERT_EQ(plain.size(), 8u);  // A and B of q and v in two layers
  ASSERT_EQ(recomputed.size(), plain.size());
  for (const auto& [name, grad] : plain) {
    EXPECT_GT(recomputed.at(name).abs().max().item<double>(), 0) << name;
    EXPECT_TRUE(torch::allclose(recomputed.at(name), grad, 1e-5, 1e-7)) << name;
  }
}

TEST(LoraTest, MergedWeightsGiveTheAdaptedLogits) {
  {
    SCOPED_TRACE("OPT: weights [out, in]");
    torch::manual_seed(3);
    OPTForCausalLM model(tiny_config());
    const torch::Tensor tokens = tokens_of(40);
    const torch::Tensor base = model->forward(tokens).detach();
    nn::LoraSpec spec;
    spec.rank = 3, spec.alpha = 5, spec.targets = {"q_proj", "v_proj", "fc1", "out_proj"};
    nn::apply_lora(*model, spec);
    randomize_adapters(*model);
    const torch::Tensor adapted = model->forward(tokens);
    OPTForCausalLM merged(tiny_config());
    train::copy_named_weights(nn::merged_lora_weights(*model, spec), *merged);
    EXPECT_LT((merged->forward(tokens) - adapted).abs().max().item<double>(), kLoraTolerance);
    EXPECT_GT((adapted - base).abs().max().item<double>(), 0.01) << "the adapters must change the outputs";
  }
  {
    SCOPED_TRACE("GPT-2: Conv1D weights [in, out], fused c_attn");
    gpt::GPTConfig c;
    c.vocab_size = 40, c.n_positions = 16, c.n_embd = 16, c.n_layer = 2, c.n_head = 2;
    torch::manual_seed(3);
    gpt::GPT model(c);
    nn::LoraSpec spec;
    spec.targets = {"c_attn", "mlp.c_fc"};
    EXPECT_EQ(nn::apply_lora(*model, spec).size(), 4u);
    randomize_adapters(*model);
    const torch::Tensor tokens = tokens_of(40);
    const torch::Tensor adapted = model->forward(tokens);
    torch::manual_seed(4);
    gpt::GPT merged(c);
    train::copy_named_weights(nn::merged_lora_weights(*model, spec), *merged);
    EXPECT_LT((merged->forward(tokens) - adapted).abs().max().item<double>(), kLoraTolerance);
  }
}

TEST(LoraTest, TargetsThatMatchNothingOrCutLayersAreNamed) {
  OPTForCausalLM model(tiny_config());
  nn::LoraSpec spec;
  spec.targets = {"query"};
  const std::string message = testing::error_message([&] { nn::apply_lora(*model, spec); });
  EXPECT_TRUE(testing::Contains(message, "query")) << message;
  EXPECT_TRUE(testing::Contains(message, "model.decoder.layers.0.self_attn.q_proj")) << message;
}

TEST(LoraTest, PeftLoadsKuafusAdapterFolderAndKuafuLoadsPefts) {
  const fs::path dir = testing::build_python_reference("opt_reference.py", "opt_lora_reference");
  const std::string base = (dir / "pre").string();
  const testing::ReferenceOutputs pre = testing::read_reference(dir / "pre.safetensors");
  const torch::Tensor ids = pre["ids"], mask = pre["mask"];

  // Kuafu -> PEFT: adapters with random B, written as an adapter folder, loaded by PeftModel.
  {
    OPTForCausalLM model = opt_format().load(base);
    nn::LoraSpec spec;
    spec.rank = 4, spec.alpha = 12, spec.targets = {"q_proj", "v_proj", "fc2"};
    nn::apply_lora(*model, spec);
    randomize_adapters(*model);
    model->eval();
    const fs::path expected = dir / "kuafu_adapter.safetensors";
    io::save_safetensors(expected.string(), {{"ids", ids}, {"mask", mask}, {"logits", testing::padded_logits(model, ids, mask)}});
    const fs::path out = dir / "kuafu_adapter";
    fs::remove_all(out);
    train::export_adapter(*model, spec, out.string(), base);
    const testing::PythonRun check =
        testing::run_python_reference("opt_reference.py", "peft " + base + " " + out.string() + " " + expected.string());
    ASSERT_EQ(check.exit_code, 0) << check.output;
    EXPECT_LT(testing::last_json_line(check.output)["max_abs_diff"].get<double>(), kLoraTolerance) << check.output;
  }
  // PEFT -> Kuafu: an adapter folder PeftModel.save_pretrained wrote (r 4 on q_proj, v_proj and fc1).
  {
    const testing::PythonRun build = testing::run_python_reference("opt_reference.py", "peft_build " + base + " " + dir.string());
    ASSERT_EQ(build.exit_code, 0) << build.output;
    const testing::ReferenceOutputs peft = testing::read_reference(dir / "adapter.safetensors");
    const nn::LoraSpec spec = train::read_adapter_config((dir / "adapter").string());
    EXPECT_EQ(spec.rank, 4);
    EXPECT_EQ(spec.alpha, 8);
    OPTForCausalLM model = opt_format().load(base);
    EXPECT_EQ(nn::apply_lora(*model, spec).size(), 6u);
    train::load_adapter(*model, (dir / "adapter").string());
    model->eval();
    EXPECT_LT(testing::max_difference_on_real_tokens(testing::padded_logits(model, ids, mask), peft["logits"], mask),
              kLoraTolerance);
    // An "r" past lora.rank's bounds, or one the stored adapters do not have, is refused before any
    // adapter is built; so is a "lora_dropout" past lora.dropout's.
    const fs::path bad = dir / "bad_adapter";
    fs::remove_all(bad);
    fs::copy(dir / "adapter", bad);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(bad / "adapter_config.json"));
    for (const auto& [r, expected] : std::vector<std::pair<int64_t, std::string>>{
             {30000000, "\"r\" = 30000000 must be in [1, 65536] (the bounds of lora.rank)"},
             {8, "which does not fit \"r\" = 8 of "}}) {
      config["r"] = r;
      std::ofstream(bad / "adapter_config.json") << config.dump();
      EXPECT_TRUE(testing::Contains(testing::expected_error([&] { train::read_adapter_config(bad.string()); }), expected));
    }
    // A dropout past lora.dropout's bounds is named, not left to LibTorch's Dropout.
    config = nlohmann::json::parse(std::ifstream(dir / "adapter" / "adapter_config.json"));
    config["lora_dropout"] = 5;
    std::ofstream(bad / "adapter_config.json") << config.dump();
    EXPECT_TRUE(testing::Contains(testing::expected_error([&] { train::read_adapter_config(bad.string()); }),
                                  "\"lora_dropout\" = 5 must be in [0, 0.9] (the bounds of lora.dropout)"));
  }
}

}  // namespace
}  // namespace kuafu::opt

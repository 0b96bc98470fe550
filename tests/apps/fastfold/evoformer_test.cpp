// Each Evoformer module against DeepMind's AlphaFold 2.3 (alphafold-colabfold 2.3.27, JAX on the CPU):
// its output and, for a fixed cotangent, the gradients of its inputs and of every parameter, on block 0
// of a tiny model's random parameters in DeepMind's .npz layout. The golden files are what
// tests/apps/fastfold/alphafold_reference.py wrote (tests/apps/fastfold/golden/alphafold_tiny; its
// manifest.json records the script's hash, arguments and versions).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <iostream>

#include <torch/torch.h>

#include "apps/fastfold/evoformer.h"
#include "core/io/npz.h"

namespace kuafu::fold {
namespace {
namespace fs = std::filesystem;

const fs::path kGolden = fs::path(KUAFU_SOURCE_DIR) / "tests/apps/fastfold/golden/alphafold_tiny";
const std::string kBlock = "alphafold/alphafold_iteration/evoformer/evoformer_iteration/";

// The tiny model's sizes (golden config.json): c_m 16, c_z 8, 2 heads, transitions ×4, outer product
// channels 4, triangle multiplication channels 8.
constexpr int64_t kMsaChannels = 16, kPairChannels = 8, kHeads = 2;

const io::NpzArrays& golden(const std::string& file) {
  static std::map<std::string, io::NpzArrays> files;
  auto found = files.find(file);
  if (found == files.end()) found = files.emplace(file, io::read_npz((kGolden / file).string())).first;
  return found->second;
}

// float32 on both sides, summed in other orders: outputs and gradients agree to 1e-5 of their largest
// entry (measured: 1e-7 to 1e-6), plus 1e-6 absolute for gradients that are zero in exact arithmetic (the
// pair-bias LayerNorm's offset shifts every logit of a row alike, so softmax ignores it: both sides give
// float32 cancellation noise, ~3e-7 here and 1e-6 in the reference). Measured figures are printed.
void expect_like_alphafold(const torch::Tensor& actual, const torch::Tensor& expected, double relative, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double scale = std::max(1e-6, expected.abs().max().item<double>());
  const double difference = (actual - expected).abs().max().item<double>();
  std::cout << "  " << what << ": max |difference| " << difference << " of max |value| " << scale << "\n";
  EXPECT_LE(difference, relative * scale + 1e-6) << what;
}

struct ModuleCase {
  std::string name;  // the module's test name and its path under the block
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  // The update from the golden inputs (requires_grad set on the float activations).
  std::function<torch::Tensor(torch::nn::Module&, const std::map<std::string, torch::Tensor>&)> run;
};

std::vector<ModuleCase> module_cases() {
  using In = std::map<std::string, torch::Tensor>;
  const auto msa_attention = [](bool column) {
    return [column] { return MsaAttention(kMsaChannels, kPairChannels, kHeads, column).ptr(); };
  };
  const auto triangle_attention = [](bool ending) {
    return [ending] { return TriangleAttention(kPairChannels, kHeads, ending).ptr(); };
  };
  const auto triangle_multiplication = [](bool outgoing) {
    return [outgoing] { return TriangleMultiplication(kPairChannels, 8, outgoing).ptr(); };
  };
  const auto on_pair = [](torch::nn::Module& m, const In& in) -> torch::Tensor {
    if (auto* t = dynamic_cast<TriangleAttentionImpl*>(&m)) return t->forward(in.at("pair_act"), in.at("pair_mask"));
    return dynamic_cast<TriangleMultiplicationImpl&>(m).forward(in.at("pair_act"), in.at("pair_mask"));
  };
  return {
      {"msa_row_attention_with_pair_bias", msa_attention(false),
       [](torch::nn::Module& m, const In& in) {
         return dynamic_cast<MsaAttentionImpl&>(m).forward(in.at("msa_act"), in.at("msa_mask"), in.at("pair_act"));
       }},
      {"msa_column_attention", msa_attention(true),
       [](torch::nn::Module& m, const In& in) { return dynamic_cast<MsaAttentionImpl&>(m).forward(in.at("msa_act"), in.at("msa_mask")); }},
      {"msa_transition", [] { return Transition(kMsaChannels, 4).ptr(); },
       [](torch::nn::Module& m, const In& in) { return dynamic_cast<TransitionImpl&>(m).forward(in.at("msa_act")); }},
      {"outer_product_mean", [] { return OuterProductMean(kMsaChannels, kPairChannels, 4).ptr(); },
       [](torch::nn::Module& m, const In& in) {
         return dynamic_cast<OuterProductMeanImpl&>(m).forward(in.at("msa_act"), in.at("msa_mask"));
       }},
      {"triangle_multiplication_outgoing", triangle_multiplication(true), on_pair},
      {"triangle_multiplication_incoming", triangle_multiplication(false), on_pair},
      {"triangle_attention_starting_node", triangle_attention(false), on_pair},
      {"triangle_attention_ending_node", triangle_attention(true), on_pair},
      {"pair_transition", [] { return Transition(kPairChannels, 4).ptr(); },
       [](torch::nn::Module& m, const In& in) { return dynamic_cast<TransitionImpl&>(m).forward(in.at("pair_act")); }},
  };
}

TEST(EvoformerModuleTest, EachModuleIsAlphaFoldsInValueAndGradient) {
  const io::NpzArrays& params = golden("params/params_model_tiny.npz");
  const io::NpzArrays& modules = golden("modules.npz");
  for (const ModuleCase& c : module_cases()) {
    SCOPED_TRACE(c.name);
    std::cout << c.name << "\n";
    std::shared_ptr<torch::nn::Module> module = c.make();
    load_alphafold_parameters(*module, params, kBlock + c.name, /*block=*/0);
    std::map<std::string, torch::Tensor> in;
    for (const auto& [key, value] : modules) {
      const std::string prefix = c.name + "/in/";
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(prefix.size());
      in[name] = name.find("mask") == std::string::npos ? value.clone().requires_grad_() : value;
    }
    ASSERT_FALSE(in.empty());
    const torch::Tensor out = c.run(*module, in);
    expect_like_alphafold(out.detach(), modules.at(c.name + "/out/out"), 1e-5, "output");
    (out * modules.at(c.name + "/dout/out")).sum().backward();
    for (const auto& [name, value] : in) {
      if (value.requires_grad()) expect_like_alphafold(value.grad(), modules.at(c.name + "/grad/" + name), 1e-5, "d/d " + name);
    }
    for (const auto& item : module->named_parameters()) {
      std::string path = item.key();
      const size_t last = path.rfind('.');
      std::string folder = last == std::string::npos ? "" : "/" + path.substr(0, last);
      for (char& ch : folder) ch = ch == '.' ? '/' : ch;
      const std::string key = c.name + "/dparam/" + kBlock + c.name + folder + "//" + path.substr(last == std::string::npos ? 0 : last + 1);
      ASSERT_TRUE(modules.count(key)) << key;
      expect_like_alphafold(item.value().grad(), modules.at(key), 1e-5, "d/d " + path);
    }
  }
}

}  // namespace
}  // namespace kuafu::fold

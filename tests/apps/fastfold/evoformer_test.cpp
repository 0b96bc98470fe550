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
#include "tests/apps/fastfold/alphafold_golden.h"
#include "tests/support/devices.h"

namespace kuafu::fold {
namespace {
using testing::expect_like_alphafold;

const std::string kBlock = "alphafold/alphafold_iteration/evoformer/evoformer_iteration/";
const std::string kExtraBlock = "alphafold/alphafold_iteration/evoformer/extra_msa_stack/";

// The tiny model's sizes (golden config.json): c_m 16, c_z 8, 2 heads, transitions ×4, outer product
// channels 4, triangle multiplication channels 8.
constexpr int64_t kMsaChannels = 16, kPairChannels = 8, kHeads = 2;



struct ModuleCase {
  std::string name;  // the module's test name and its path under the block
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  // The update from the golden inputs (requires_grad set on the float activations).
  std::function<torch::Tensor(torch::nn::Module&, const std::map<std::string, torch::Tensor>&)> run;
  std::string block = kBlock;  // where its parameters lie
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
      {"msa_column_global_attention", [] { return MsaColumnGlobalAttention(8, kHeads).ptr(); },
       [](torch::nn::Module& m, const In& in) {
         return dynamic_cast<MsaColumnGlobalAttentionImpl&>(m).forward(in.at("msa_act"), in.at("msa_mask"));
       },
       kExtraBlock},
  };
}

TEST(EvoformerModuleTest, EachModuleIsAlphaFoldsInValueAndGradient) {
  const io::NpzArrays& params = testing::alphafold_golden("params/params_model_tiny.npz");
  const io::NpzArrays& modules = testing::alphafold_golden("modules.npz");
  for (const ModuleCase& c : module_cases()) {
    SCOPED_TRACE(c.name);
    std::cout << c.name << "\n";
    std::shared_ptr<torch::nn::Module> module = c.make();
    load_alphafold_parameters(*module, params, c.block + c.name, /*block=*/0);
    std::map<std::string, torch::Tensor> in;
    for (const auto& [key, value] : modules) {
      const std::string prefix = c.name + "/in/";
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string name = key.substr(prefix.size());
      in[name] = name.find("mask") == std::string::npos ? value.clone().requires_grad_() : value;
    }
    ASSERT_FALSE(in.empty());
    const torch::Tensor out = c.run(*module, in);
    expect_like_alphafold(out.detach(), modules.at(c.name + "/out/out"), "output");
    (out * modules.at(c.name + "/dout/out")).sum().backward();
    for (const auto& [name, value] : in) {
      if (value.requires_grad()) expect_like_alphafold(value.grad(), modules.at(c.name + "/grad/" + name), "d/d " + name);
    }
    testing::expect_parameter_gradients_like_alphafold(*module, modules, c.name, c.block + c.name);
  }
}

// A whole Evoformer iteration and an extra-MSA iteration (block 0 of each stack): both streams and the
// gradients of both and of every parameter.
TEST(EvoformerModuleTest, AnIterationOfEitherStackIsAlphaFolds) {
  const io::NpzArrays& params = testing::alphafold_golden("params/params_model_tiny.npz");
  const io::NpzArrays& iterations = testing::alphafold_golden("evoformer.npz");
  for (const auto& [test, sizes] :
       {std::pair<std::string, EvoformerSizes>{"evoformer_iteration", {kMsaChannels, kPairChannels, kHeads, kHeads, 4, 8, 4, false}},
        std::pair<std::string, EvoformerSizes>{"extra_msa_stack", {8, kPairChannels, kHeads, kHeads, 4, 8, 4, true}}}) {
    SCOPED_TRACE(test);
    std::cout << test << "\n";
    const std::string path = "alphafold/alphafold_iteration/evoformer/" + test;
    EvoformerBlock block(sizes);
    load_alphafold_parameters(*block, params, path, /*block=*/0);
    const torch::Tensor m = iterations.at(test + "/in/msa").clone().requires_grad_();
    const torch::Tensor z = iterations.at(test + "/in/pair").clone().requires_grad_();
    const auto [m_out, z_out] = block->forward(m, z, iterations.at(test + "/in/msa_mask"), iterations.at(test + "/in/pair_mask"));
    expect_like_alphafold(m_out.detach(), iterations.at(test + "/out/msa"), "msa");
    expect_like_alphafold(z_out.detach(), iterations.at(test + "/out/pair"), "pair");
    ((m_out * iterations.at(test + "/dout/msa")).sum() + (z_out * iterations.at(test + "/dout/pair")).sum()).backward();
    expect_like_alphafold(m.grad(), iterations.at(test + "/grad/msa"), "d/d msa");
    expect_like_alphafold(z.grad(), iterations.at(test + "/grad/pair"), "d/d pair");
    testing::expect_parameter_gradients_like_alphafold(*block, iterations, test, path);
  }
}

// Chunked inference: an Evoformer iteration and an extra-MSA iteration with their attention, transitions and
// outer product mean 3 entries at a time equal the whole computation, values and every gradient (float64,
// padded rows and columns included: 1e-12 of the largest entry), and so do both without gradients (the
// in-place inference path); on every device the machine has.
void expect_chunked_equals_whole_on(const torch::Device& device) {
  auto g = at::detail::createCPUGenerator(17);
  const auto options = torch::TensorOptions(torch::kFloat64).device(device);
  for (const bool extra : {false, true}) {
    EvoformerBlock block(EvoformerSizes{extra ? 8 : 16, 8, 2, 2, 4, 8, 4, extra});
    block->to(torch::kFloat64);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : block->parameters()) p.normal_(0, 0.3, g);
    }
    block->to(device);
    const int64_t s = 5, r = 11;
    const torch::Tensor m0 = torch::randn({s, r, extra ? 8 : 16}, g, torch::kFloat64).to(device);
    const torch::Tensor z0 = torch::randn({r, r, 8}, g, torch::kFloat64).to(device);
    torch::Tensor msa_mask = torch::ones({s, r}, options), pair_mask = torch::ones({r, r}, options);
    msa_mask[s - 1].narrow(0, 6, 5).zero_();
    pair_mask.narrow(0, r - 2, 2).zero_();
    std::vector<torch::Tensor> outputs, gradients;
    for (const int64_t chunk : {int64_t{0}, int64_t{3}}) {
      block->zero_grad();
      const torch::Tensor m = m0.clone().requires_grad_(), z = z0.clone().requires_grad_();
      const auto [m_out, z_out] = block->forward(m, z, msa_mask, pair_mask, chunk);
      (m_out.square().sum() + z_out.square().sum()).backward();
      outputs.push_back(torch::cat({m_out.detach().flatten(), z_out.detach().flatten()}));
      std::vector<torch::Tensor> grads = {m.grad().flatten(), z.grad().flatten()};
      for (const auto& p : block->parameters()) grads.push_back(p.grad().flatten());
      gradients.push_back(torch::cat(grads));
    }
    // Without gradients (inference's in-place path), whole and chunked.
    for (const int64_t chunk : {int64_t{0}, int64_t{3}}) {
      torch::NoGradGuard no_grad;
      const auto [m_out, z_out] = block->forward(m0, z0, msa_mask, pair_mask, chunk);
      outputs.push_back(torch::cat({m_out.flatten(), z_out.flatten()}));
    }
    for (size_t i = 1; i < outputs.size(); ++i)
      EXPECT_LT((outputs[0] - outputs[i]).abs().max().item<double>(), 1e-12 * outputs[0].abs().max().item<double>()) << extra << " " << i;
    EXPECT_LT((gradients[0] - gradients[1]).abs().max().item<double>(), 1e-12 * gradients[0].abs().max().item<double>()) << extra;
  }
}

TEST(EvoformerBlockTest, ChunkedEqualsWhole) {
  for (const torch::Device& device : kuafu::testing::devices_to_test()) {
    SCOPED_TRACE(device.str());
    expect_chunked_equals_whole_on(device);
  }
}

}  // namespace
}  // namespace kuafu::fold

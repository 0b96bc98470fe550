// What the Hugging Face parity tests share: a reference script's outputs built into a fresh folder,
// read by name, and a causal language model's logits of a left-padded batch at each row's positions.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "core/nn/generation.h"
#include "core/util/error.h"
#include "tests/support/python_reference.h"
#include "tests/support/test_util.h"

namespace kuafu::testing {

// A reference's outputs (a safetensors file) by name; a missing one is an error, never a skip.
struct ReferenceOutputs {
  io::SafetensorsFile file;
  std::string path;
  const torch::Tensor& operator[](const std::string& name) const {
    const torch::Tensor* t = file.find(name);
    if (!t) throw Error(path + " has no " + name);
    return *t;
  }
};

inline ReferenceOutputs read_reference(const std::filesystem::path& path) {
  return {io::load_safetensors(path.string()), path.string()};
}

// Runs `script build DIR` into a fresh temporary folder named after `name` and returns the folder.
inline std::filesystem::path build_python_reference(const std::string& script, const std::string& name) {
  const std::filesystem::path dir = temp_dir(name);
  const PythonRun run = run_python_reference(script, "build " + dir.string());
  if (run.exit_code != 0) throw Error(script + " build failed:\n" + run.output);
  return dir;
}

// A reference built into its folder with one outputs file (reference.safetensors), read by name.
struct Reference {
  std::filesystem::path dir;
  ReferenceOutputs outputs;
  const torch::Tensor& operator[](const std::string& name) const { return outputs[name]; }
};

inline Reference build_reference(const std::string& script, const std::string& name) {
  const std::filesystem::path dir = build_python_reference(script, name);
  return {dir, read_reference(dir / "reference.safetensors")};
}

// Logits [B, T, V] of a left-padded batch (mask: 1 for a real token), each row at the positions of
// its real tokens, through the model's decode (as generation runs it).
template <typename ModelHolder>
torch::Tensor padded_logits(ModelHolder& model, const torch::Tensor& ids, const torch::Tensor& mask) {
  torch::NoGradGuard no_grad;
  std::vector<ops::KVCache> caches;
  return model->decode(nn::whole_rows_step(ids, mask), caches);
}

// The largest difference at real tokens (padding's own outputs are nobody's business).
// The largest |a − b| (in float64).
inline double max_abs_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

inline double max_difference_on_real_tokens(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& mask) {
  return (a - b).abs().index({mask.to(torch::kBool)}).max().item<double>();
}

// Each row's real tokens, as prompts for nn::generate.
inline std::vector<std::vector<int64_t>> prompts_of(const torch::Tensor& ids, const torch::Tensor& mask) {
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t row = 0; row < ids.size(0); ++row) {
    const torch::Tensor real = ids[row].index({mask[row].to(torch::kBool)}).contiguous();
    prompts.emplace_back(real.data_ptr<int64_t>(), real.data_ptr<int64_t>() + real.numel());
  }
  return prompts;
}

inline std::vector<std::vector<int64_t>> rows_of(const torch::Tensor& tokens) {
  std::vector<std::vector<int64_t>> rows;
  for (int64_t row = 0; row < tokens.size(0); ++row) {
    const torch::Tensor r = tokens[row].contiguous();
    rows.emplace_back(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  }
  return rows;
}

}  // namespace kuafu::testing

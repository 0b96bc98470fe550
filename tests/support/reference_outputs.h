// What the Hugging Face parity tests share: a reference script's outputs built into a fresh folder,
// read by name, and a causal language model's logits of a left-padded batch at each row's positions.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
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

inline std::string read_file_or_empty(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// `script build DIR`'s folder, built once for every test process of the build tree (each test runs in a
// process of its own, and the Python side spends seconds importing its libraries): kept under
// KUAFU_REFERENCE_CACHE by a key of every reference script's text and the venv's setup stamp, so a
// changed script or pinned library builds afresh. The scripts seed their tiny models, so a build is
// the same whenever it is made.
inline std::filesystem::path cached_python_build(const std::string& script) {
  namespace fs = std::filesystem;
  const fs::path source = fs::path(KUAFU_SOURCE_DIR);
  std::string text = script + "\n" + read_file_or_empty(source / ".venv/.kuafu-setup");
  std::vector<fs::path> scripts;
  for (const auto& entry : fs::directory_iterator(source / "tests/python")) scripts.push_back(entry.path());
  std::sort(scripts.begin(), scripts.end());
  for (const fs::path& path : scripts) text += path.filename().string() + "\n" + read_file_or_empty(path);
  std::ostringstream key;
  key << std::hex << std::hash<std::string>{}(text);
  const fs::path built = fs::path(KUAFU_REFERENCE_CACHE) / (fs::path(script).stem().string() + "-" + key.str());
  if (fs::exists(built / "complete")) return built;
  // Built beside the cache entry and renamed into place: two processes building at once both succeed.
  const fs::path building = built.string() + ".building-" + std::to_string(::getpid());
  fs::remove_all(building);
  fs::create_directories(building);
  const PythonRun run = run_python_reference(script, "build " + building.string());
  if (run.exit_code != 0) throw Error(script + " build failed:\n" + run.output);
  std::ofstream(building / "complete") << script << "\n";
  std::error_code taken;
  fs::rename(building, built, taken);
  if (taken) fs::remove_all(building);  // another process's build got there first: the same files
  return built;
}

// `script build DIR`'s outputs copied into a fresh temporary folder named after `name` (the test may
// write beside them), and the folder.
inline std::filesystem::path build_python_reference(const std::string& script, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = temp_dir(name);
  fs::copy(cached_python_build(script), dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  fs::remove(dir / "complete");
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

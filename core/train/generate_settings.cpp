#include "core/train/generate_settings.h"

namespace kuafu::train {

void add_generate_schema(config::Schema& s, const std::string& prompt, double temperature) {
  s.add_string("generate.prompt", prompt, "text to continue");
  s.add_string_list("generate.prompts", {},
                    "several texts continued together as one left-padded batch (instead of generate.prompt)");
  s.add_int("generate.max_new_tokens", 200, "tokens to sample").min(1);
  s.add_float("generate.temperature", temperature, "softmax temperature; 0 = greedy").min(0).max(10);
  s.add_int("generate.top_k", 40, "sample among the k most likely tokens; 0 = off").min(0);
  // 0 would keep no token to sample from: refused with the other keys, not during sampling.
  s.add_float("generate.top_p", 0.95, "nucleus sampling mass in (0, 1]; 1 = off").min(0.001).max(1.0);
  s.add_int("generate.seed", 0, "sampling seed").min(0);
  s.add_bool("generate.cuda_graphs", true,
             "on a CUDA device, capture one decoding step as a CUDA graph and replay it per token (models without "
             "hooks or tensor parallelism); false: launch every step's kernels");
  s.add_string("generate.cache", "auto",
               "how the key-value caches hold the tokens after the prompt: growing (concatenated each step), reserved "
               "(buffers written in place), fixed_shape (whole buffers, empty slots masked: what CUDA graphs replay), "
               "auto (fixed_shape replayed as graphs where generate.cuda_graphs allows, else reserved)")
      .choices({"auto", "growing", "reserved", "fixed_shape"});
}

GenerateSettings generate_settings(const config::Config& config) {
  GenerateSettings g;
  g.prompts = config.get_string_list("generate.prompts");
  g.prompts_key = "generate.prompts";
  if (g.prompts.empty()) {
    g.prompts = {config.get_string("generate.prompt")};
    g.prompts_key = "generate.prompt";
  }
  g.sampling.max_new_tokens = config.get_int("generate.max_new_tokens");
  g.sampling.temperature = config.get_float("generate.temperature");
  g.sampling.top_k = config.get_int("generate.top_k");
  g.sampling.top_p = config.get_float("generate.top_p");
  g.sampling.seed = static_cast<uint64_t>(config.get_int("generate.seed"));
  g.sampling.cuda_graphs = config.get_bool("generate.cuda_graphs");
  using Cache = nn::SamplingOptions::Cache;
  const std::string cache = config.get_string("generate.cache");
  g.sampling.cache = cache == "growing" ? Cache::kGrowing : cache == "reserved" ? Cache::kReserved
                     : cache == "fixed_shape" ? Cache::kFixedShape : Cache::kAuto;
  return g;
}

}  // namespace kuafu::train

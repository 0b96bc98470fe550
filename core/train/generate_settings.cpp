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
  return g;
}

}  // namespace kuafu::train

// The generate.* keys every language-model app shares: what to continue and how to sample.
#pragma once

#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/nn/generation.h"

namespace kuafu::train {

// generate.prompt (default `prompt`), generate.prompts, max_new_tokens, temperature (default
// `temperature`; 0 = greedy), top_k, top_p, seed.
void add_generate_schema(config::Schema& schema, const std::string& prompt, double temperature);

struct GenerateSettings {
  std::vector<std::string> prompts;  // generate.prompts, or else generate.prompt alone
  std::string prompts_key;           // the key they came from, for messages
  nn::SamplingOptions sampling;      // (the stop token and vocabulary limit are the app's)
};
GenerateSettings generate_settings(const config::Config& config);

}  // namespace kuafu::train

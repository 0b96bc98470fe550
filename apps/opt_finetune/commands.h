// kuafu-opt: its own command (prepare: token files for plain text) and the App that gives the shared
// commands (finetune, eval, generate, export, benchmark; core/train/app.h) the OPT and its data.
// export writes the model with any LoRA adapters merged in (OPTForCausalLM.from_pretrained loads it),
// or with --adapter only the adapters (PeftModel.from_pretrained loads them onto the base).
#pragma once

#include <string>

#include "apps/opt_finetune/task.h"
#include "core/train/model_app.h"

namespace kuafu::opt {

// What every program whose trained model is the causal LM of OPT's settings says of it (kuafu-opt's
// model, DPO's policy, PPO's and GRPO's actor): its size, its export (adapters merged, or --adapter), its
// benchmark, and text generation with it. Its settings are read once, from `config` (which must outlive it).
class CausalLmApp : public train::ModelApp<nn::CausalLMPtr> {
 public:
  // `name`: the model's section (models.<name> over the top-level keys; "" for kuafu-opt's and DPO's).
  explicit CausalLmApp(const config::Config& config, std::string name = "");

  nlohmann::json export_model(const std::string& out, io::HfWriteOptions options, const config::ParsedCommand& command) override;
  nlohmann::json benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) override;
  train::TextFraming text_framing() override;
  nn::Decoder decoder() override { return nn::decoder_of(model()); }

 protected:
  train::ModelRecipe<nn::CausalLMPtr> recipe() const override { return causal_lm_recipe(config_, settings_, name_); }

  const std::string name_;
  const config::Config section_;  // the model's view of the config
  const OptSettings settings_;
};

// The App of the shared commands, its settings read from `config` (which must outlive it).
std::unique_ptr<train::App> make_opt_app(const config::Config& config);

void prepare_command(const config::Config& config);


int run_opt_app(int argc, const char* const argv[]);

}  // namespace kuafu::opt

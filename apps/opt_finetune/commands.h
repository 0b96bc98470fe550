// kuafu-opt's subcommands: prepare (token files for plain text), finetune, eval, generate, export (a
// Hugging Face folder, merged, or a PEFT adapter folder) and benchmark. run_opt_app parses the
// command line and catches errors.
#pragma once

#include <string>

#include "core/config/config.h"
#include "core/train/trainer.h"

namespace kuafu::opt {

void prepare_command(const config::Config& config);
train::TrainSummary finetune_command(const config::Config& config);
// `checkpoint`: a folder, "" for the latest in train.out_dir, or "init" for the weights the run
// starts from (model.init_from, adapters at their initial values).
void eval_command(const config::Config& config, const std::string& checkpoint);
void generate_command(const config::Config& config, const std::string& checkpoint, const std::string& prompt);
// A new folder `out`: the model with any LoRA adapters merged in (OPTForCausalLM.from_pretrained
// loads it), or with `adapter` only the adapters (PeftModel.from_pretrained loads them onto the base).
void export_command(const config::Config& config, const std::string& checkpoint, const std::string& out, bool adapter);
void benchmark_command(const config::Config& config);

int run_opt_app(int argc, const char* const argv[]);

}  // namespace kuafu::opt

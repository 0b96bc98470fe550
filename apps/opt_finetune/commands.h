// kuafu-opt: its own command (prepare: token files for plain text) and the App that gives the shared
// commands (finetune, eval, generate, export, benchmark; core/train/app.h) the OPT and its data.
// export writes the model with any LoRA adapters merged in (OPTForCausalLM.from_pretrained loads it),
// or with --adapter only the adapters (PeftModel.from_pretrained loads them onto the base).
#pragma once

#include <string>

#include "apps/opt_finetune/task.h"
#include "core/train/app.h"

namespace kuafu::opt {

// The App of the shared commands, its settings read from `config` (which must outlive it).
std::unique_ptr<train::App> make_opt_app(const config::Config& config);

void prepare_command(const config::Config& config);


int run_opt_app(int argc, const char* const argv[]);

}  // namespace kuafu::opt

// kuafu-gpt: its own command (prepare: tokenizer + token files) and the App that gives the shared
// commands (train, eval, generate, export, benchmark; core/train/app.h) the GPT and its data.
#pragma once

#include <string>

#include "apps/gpt/task.h"
#include "core/train/app.h"

namespace kuafu::gpt {

// The App of the shared commands, its settings read from `config` (which must outlive it).
std::unique_ptr<train::App> make_gpt_app(const config::Config& config);

void prepare_command(const config::Config& config);

// The whole program; returns the exit code.
int run_gpt_app(int argc, const char* const argv[]);

}  // namespace kuafu::gpt

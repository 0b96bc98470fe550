// kuafu-vit: its own command (prepare: check and summarise the data) and the App that gives the
// shared commands (train, eval, export, benchmark; core/train/app.h) the ViT and its image sets.
#pragma once

#include "apps/vit/task.h"
#include "core/train/app.h"

namespace kuafu::vit {

// The App of the shared commands, its settings read from `config` (which must outlive it).
std::unique_ptr<train::App> make_vit_app(const config::Config& config);

void prepare_command(const config::Config& config);
// train as `kuafu-vit train` runs it.
train::TrainSummary train_command(const config::Config& config);

// The whole program; returns the exit code.
int run_vit_app(int argc, const char* const argv[]);

}  // namespace kuafu::vit

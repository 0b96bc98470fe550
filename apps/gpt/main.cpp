// kuafu-gpt: GPT-2 training pipeline (see README.md and `kuafu-gpt --help`).
#include "apps/gpt/commands.h"

int main(int argc, char** argv) { return kuafu::gpt::run_gpt_app(argc, argv); }

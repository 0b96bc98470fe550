// kuafu-gpt: GPT-2 training pipeline (see README.md and `kuafu-gpt --help`).
#include "apps/gpt/commands.h"
#include "core/util/process_setup.h"

int main(int argc, char** argv) {
  kuafu::set_up_process(argv);
  return kuafu::gpt::run_gpt_app(argc, argv);
}

// kuafu-opt: OPT fine-tuning pipeline (see docs/opt.md and `kuafu-opt --help`).
#include "apps/opt_finetune/commands.h"
#include "core/util/process_setup.h"

int main(int argc, char** argv) {
  kuafu::set_up_process(argv);
  return kuafu::opt::run_opt_app(argc, argv);
}

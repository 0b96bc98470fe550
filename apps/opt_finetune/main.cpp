// kuafu-opt: OPT fine-tuning pipeline (see docs/opt.md and `kuafu-opt --help`).
#include "apps/opt_finetune/commands.h"
#include "core/util/malloc_tuning.h"
#include "core/util/openmp_env.h"

int main(int argc, char** argv) {
  kuafu::restart_with_passive_openmp_waits(argv);
  kuafu::keep_freed_memory_for_reuse();
  return kuafu::opt::run_opt_app(argc, argv);
}

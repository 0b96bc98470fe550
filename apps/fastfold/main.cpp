// kuafu-fold: AlphaFold 2 structure training and prediction (see docs/fastfold.md and `kuafu-fold --help`).
#include "apps/fastfold/commands.h"
#include "core/util/malloc_tuning.h"
#include "core/util/openmp_env.h"

int main(int argc, char** argv) {
  kuafu::restart_with_passive_openmp_waits(argv);
  kuafu::keep_freed_memory_for_reuse();
  return kuafu::fold::run_fold_app(argc, argv);
}

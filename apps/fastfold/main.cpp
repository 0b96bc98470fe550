// kuafu-fold: AlphaFold 2 structure training and prediction (see docs/fastfold.md and `kuafu-fold --help`).
#include "apps/fastfold/commands.h"
#include "core/util/malloc_tuning.h"
#include "core/util/openmp_env.h"

#include <cstring>

int main(int argc, char** argv) {
  kuafu::restart_with_passive_openmp_waits(argv);
  // Training reuses freed memory (each step allocates alike); a prediction is one pass at lengths where its
  // memory is what matters: glibc's defaults give large blocks back when freed, so its peak is what it holds.
  if (argc < 2 || std::strcmp(argv[1], "predict") != 0) kuafu::keep_freed_memory_for_reuse();
  return kuafu::fold::run_fold_app(argc, argv);
}

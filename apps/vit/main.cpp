// kuafu-vit: ViT image-classification pipeline (see README.md and `kuafu-vit --help`).
#include "apps/vit/commands.h"
#include "core/util/malloc_tuning.h"
#include "core/util/openmp_env.h"

int main(int argc, char** argv) {
  kuafu::restart_with_passive_openmp_waits(argv);
  kuafu::keep_freed_memory_for_reuse();
  return kuafu::vit::run_vit_app(argc, argv);
}

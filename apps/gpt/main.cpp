// kuafu-gpt: GPT-2 training pipeline (see README.md and `kuafu-gpt --help`).
#include "apps/gpt/commands.h"
#include "core/util/malloc_tuning.h"
#include "core/util/openmp_env.h"

int main(int argc, char** argv) {
  kuafu::restart_with_passive_openmp_waits(argv);
  kuafu::keep_freed_memory_for_reuse();
  return kuafu::gpt::run_gpt_app(argc, argv);
}

// What every Kuafu executable does first, so that no app runs with glibc's and libgomp's defaults (kuafu-chat
// and kuafu-sd once did: a PPO update of two 358M-parameter models took 6.7 s instead of 4.6 s here).
#pragma once

#include "core/util/malloc_tuning.h"
#include "core/util/openmp_env.h"

namespace kuafu {

// Restarts the program with passive OpenMP waits unless OMP_WAIT_POLICY is set (openmp_env.h), then keeps
// freed heap memory for reuse (malloc_tuning.h). Call first thing in main.
inline void set_up_process(char** argv) {
  restart_with_passive_openmp_waits(argv);
  keep_freed_memory_for_reuse();
}

}  // namespace kuafu

#include "core/util/openmp_env.h"

#include <unistd.h>

#include <cstdlib>

namespace kuafu {

void restart_with_passive_openmp_waits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0) != 0) return;
  execv("/proc/self/exe", argv);
  // Only reached when the restart failed (e.g. no /proc): carry on with the spinning default.
}

}  // namespace kuafu

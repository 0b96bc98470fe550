// OpenMP settings that must exist before the process starts: libgomp reads OMP_WAIT_POLICY once, when
// it is loaded, before main. Its default lets idle workers spin, which on a CPU shared by LibTorch's
// and OpenBLAS's parallel regions made fp32 training steps 1.3-1.8x slower (measured: README).
#pragma once

namespace kuafu {

// When the user has not set OMP_WAIT_POLICY, sets it to "passive" and restarts this program with the
// same arguments (execv of /proc/self/exe); returns only when no restart was needed or it failed.
// Call first thing in main. Set OMP_WAIT_POLICY yourself (e.g. "active") to keep your choice.
void restart_with_passive_openmp_waits(char** argv);

}  // namespace kuafu

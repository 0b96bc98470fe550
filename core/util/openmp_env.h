// OpenMP settings that must exist before the process starts: libgomp reads OMP_WAIT_POLICY and
// GOMP_SPINCOUNT once, when it is loaded, before main. Its default lets idle workers spin for about 3 ms,
// which on a CPU shared by LibTorch's and OpenBLAS's parallel regions made fp32 training steps 1.3-1.8x
// slower; sleeping at once instead cost decoding a thread wake per product (Qwen2.5-0.5B's shape, one row:
// 84-89 ms a token passive, 56-59 with a spin of about 0.1 ms first, the weights' read at this machine's
// bandwidth taking about 55; README, "Performance").
#pragma once

#include <functional>
#include <map>
#include <string>

namespace kuafu {

// What libgomp spins before it sleeps in Kuafu's processes: about 0.1 ms by its rough 100,000 spins per ms.
inline constexpr const char* kOpenMpSpinCount = "10000";

// The variables restart_with_passive_openmp_waits sets, given the environment (`get` returns null for an
// unset name): none when OMP_WAIT_POLICY is set (the user's choice, or the restarted process); else
// OMP_WAIT_POLICY = passive, and GOMP_SPINCOUNT = kOpenMpSpinCount unless the user set it.
std::map<std::string, std::string> openmp_settings_to_add(const std::function<const char*(const char*)>& get);

// When the user has not set OMP_WAIT_POLICY, sets the variables above and restarts this program with the
// same arguments (execv of /proc/self/exe); returns only when no restart was needed or it failed.
// Call first thing in main. Set OMP_WAIT_POLICY yourself (e.g. "active") to keep your choice.
void restart_with_passive_openmp_waits(char** argv);

}  // namespace kuafu

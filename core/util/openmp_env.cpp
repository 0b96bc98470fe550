#include "core/util/openmp_env.h"

#include <unistd.h>

#include <cstdlib>

namespace kuafu {

std::map<std::string, std::string> openmp_settings_to_add(const std::function<const char*(const char*)>& get) {
  if (get("OMP_WAIT_POLICY") != nullptr) return {};
  std::map<std::string, std::string> settings = {{"OMP_WAIT_POLICY", "passive"}};
  if (get("GOMP_SPINCOUNT") == nullptr) settings["GOMP_SPINCOUNT"] = kOpenMpSpinCount;
  return settings;
}

void restart_with_passive_openmp_waits(char** argv) {
  const std::map<std::string, std::string> settings = openmp_settings_to_add([](const char* name) { return std::getenv(name); });
  if (settings.empty()) return;
  for (const auto& [name, value] : settings) {
    if (setenv(name.c_str(), value.c_str(), /*overwrite=*/0) != 0) return;
  }
  execv("/proc/self/exe", argv);
  // Only reached when the restart failed (e.g. no /proc): carry on with the spinning default.
}

}  // namespace kuafu

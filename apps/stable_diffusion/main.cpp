// kuafu-sd: Stable Diffusion (see docs/stable_diffusion.md and `kuafu-sd --help`).
#include <cstring>

#include "apps/stable_diffusion/commands.h"
#include "apps/stable_diffusion/sample_command.h"
#include "core/util/process_setup.h"

int main(int argc, char** argv) {
  kuafu::set_up_process(argv);
  if (argc >= 2 && std::strcmp(argv[1], "sample") == 0) return kuafu::sd::run_sample(argc - 1, argv + 1);
  return kuafu::sd::run_sd_app(argc, argv);
}

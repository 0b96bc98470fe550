// kuafu-sd: Stable Diffusion (see docs/stable_diffusion.md and `kuafu-sd --help`). So far: sample.
#include <cstring>
#include <iostream>

#include "apps/stable_diffusion/sample_command.h"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "sample") == 0) return kuafu::sd::run_sample(argc - 1, argv + 1);
  const bool help = argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
  (help ? std::cout : std::cerr) << "usage: kuafu-sd sample --model DIR --prompt TEXT --out FILE.png [options]\n"
                                    "  sample  text to images from a diffusers pipeline folder (kuafu-sd sample --help)\n"
                                    "Training and fine-tuning are not built yet (docs/stable_diffusion.md).\n";
  return help ? 0 : 1;
}

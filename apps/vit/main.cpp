// kuafu-vit: ViT image-classification pipeline (see README.md and `kuafu-vit --help`).
#include "apps/vit/commands.h"
#include "core/util/process_setup.h"

int main(int argc, char** argv) {
  kuafu::set_up_process(argv);
  return kuafu::vit::run_vit_app(argc, argv);
}

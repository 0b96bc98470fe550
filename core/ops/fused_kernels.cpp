#include "core/ops/fused_kernels.h"

#include <atomic>

namespace kuafu::ops {

namespace {

std::atomic<bool> fused_loss{true};
std::atomic<bool> fused_layer_norm{true};
std::atomic<bool> skinny_products{true};
std::atomic<bool> fused_gelu{true};

}  // namespace

FusedKernels fused_kernels() { return {fused_loss.load(), fused_layer_norm.load(), skinny_products.load(), fused_gelu.load()}; }

void set_fused_kernels(const FusedKernels& kernels) {
  fused_loss.store(kernels.loss);
  fused_layer_norm.store(kernels.layer_norm);
  skinny_products.store(kernels.skinny_linear);
  fused_gelu.store(kernels.gelu);
}

}  // namespace kuafu::ops

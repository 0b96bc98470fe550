// Which fused paths the process takes: a process-wide choice, like LibTorch's backend flags, set once per
// command from the config (runtime.fused_loss, runtime.fused_layer_norm, runtime.skinny_linear,
// runtime.fused_gelu) and by tests that compare a fused path with the plain one. Each is on by default
// where it was measured faster (docs/gpu.md, README).
#pragma once

namespace kuafu::ops {

struct FusedKernels {
  bool loss = true;        // ops::linear_cross_entropy for a serial tied output layer
  bool layer_norm = true;  // ops::layer_norm's CUDA kernels for LayerNorm on a GPU
  bool skinny_linear = true;  // ops::skinny_linear for a few rows through a serial layer on the CPU (decoding)
  bool gelu = true;           // ops::gelu_tanh's CPU kernels for float32
};

FusedKernels fused_kernels();
void set_fused_kernels(const FusedKernels& kernels);

}  // namespace kuafu::ops

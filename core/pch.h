// Precompiled header for every translation unit that uses LibTorch: including <torch/torch.h>
// costs ~15 s and ~1.2 GB per file, so it is parsed once per target here.
#pragma once

#include <torch/torch.h>

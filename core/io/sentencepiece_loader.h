// Finds and dlopens kuafu_spm_bridge (see sentencepiece_bridge.h) once per process.
#pragma once

#include "core/io/sentencepiece_bridge.h"

namespace kuafu::io {

// The bridge's function table, loaded on first use (thread-safe) and kept for the whole process.
// Searched, first hit wins:
//   1. $KUAFU_SPM_BRIDGE, when set (then nothing else is tried);
//   2. the running executable's folder, then its ../lib/ (an installed layout);
//   3. the build-tree path compiled in (KUAFU_SPM_BRIDGE_PATH).
// Throws kuafu::Error naming every path tried and why it failed; a later call tries again.
const KuafuSpmApi& sentencepiece_bridge();

}  // namespace kuafu::io

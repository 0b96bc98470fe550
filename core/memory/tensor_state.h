// The life cycle of a tensor inside a Gemini chunk, with only the legal transitions allowed:
//
//   FREE --gather--> HOLD --use--> COMPUTE --forward done--> HOLD --release--> FREE
//                                  COMPUTE --backward done--> HOLD_AFTER_BWD --used again--> COMPUTE
//                                  HOLD_AFTER_BWD --gradient complete--> READY_FOR_REDUCE --reduced--> HOLD
//
// A chunk may be released or moved only when none of its tensors is in COMPUTE, HOLD_AFTER_BWD or
// READY_FOR_REDUCE (their data or gradient is still needed where it is).
#pragma once

#include <string>

namespace kuafu::memory {

enum class TensorState { kFree, kHold, kCompute, kHoldAfterBackward, kReadyForReduce };

std::string state_name(TensorState state);
bool legal_transition(TensorState from, TensorState to);
// Throws kuafu::Error naming the tensor and both states when the transition is not legal.
void check_transition(const std::string& tensor, TensorState from, TensorState to);
// True when a chunk whose tensor is in `state` may be released or moved to another tier.
bool movable(TensorState state);

}  // namespace kuafu::memory

#include "core/memory/tensor_state.h"

#include "core/util/error.h"

namespace kuafu::memory {

std::string state_name(TensorState state) {
  switch (state) {
    case TensorState::kFree: return "free";
    case TensorState::kHold: return "hold";
    case TensorState::kCompute: return "compute";
    case TensorState::kHoldAfterBackward: return "hold-after-backward";
    case TensorState::kReadyForReduce: return "ready-for-reduce";
  }
  return "unknown";
}

bool legal_transition(TensorState from, TensorState to) {
  using S = TensorState;
  switch (from) {
    case S::kFree: return to == S::kHold;
    case S::kHold: return to == S::kCompute || to == S::kFree;
    case S::kCompute: return to == S::kHold || to == S::kHoldAfterBackward;
    case S::kHoldAfterBackward: return to == S::kCompute || to == S::kReadyForReduce;
    case S::kReadyForReduce: return to == S::kHold;
  }
  return false;
}

void check_transition(const std::string& tensor, TensorState from, TensorState to) {
  KUAFU_CHECK(legal_transition(from, to), "chunk tensor '", tensor, "': illegal state change ", state_name(from),
              " -> ", state_name(to));
}

bool movable(TensorState state) { return state == TensorState::kFree || state == TensorState::kHold; }

}  // namespace kuafu::memory

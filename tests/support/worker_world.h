// The distributed world of a multi-process test worker (Gloo over loopback on the CPU, short timeout),
// so a broken collective fails the test in seconds instead of hanging it.
#pragma once

#include "core/dist/process_group.h"

namespace kuafu::testing {

inline std::shared_ptr<dist::World> worker_world() {
  dist::WorldOptions options;
  options.device = "cpu";
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(30);
  return dist::World::init(dist::detect_launch_env(), options);
}

}  // namespace kuafu::testing

// Passing a process group through a custom autograd function's context (for the backward pass).
#pragma once

#include "core/dist/process_group.h"

namespace torch::autograd {
struct AutogradContext;
}

namespace kuafu::dist::autograd {

// Stores `group` in `ctx`, which keeps it alive as long as the graph that may run its backward.
void save_group(torch::autograd::AutogradContext* ctx, GroupPtr group);
const ProcessGroup& saved_group(torch::autograd::AutogradContext* ctx);
GroupPtr saved_group_ptr(torch::autograd::AutogradContext* ctx);

}  // namespace kuafu::dist::autograd

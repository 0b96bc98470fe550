// The published OPT shapes (Zhang et al., 2022, table 1, as the Hugging Face configs give them):
// 125m, 350m (post-LN, 512-wide embedding), 1.3b, 2.7b, 6.7b, 13b, 30b and 66b, each with the
// 50,272-row embedding and 2,048 positions.
#pragma once

#include <string>
#include <vector>

#include "apps/opt_finetune/model.h"

namespace kuafu::opt {

std::vector<std::string> opt_shape_names();
// kuafu::Error listing the names for an unknown one.
OPTConfig opt_shape(const std::string& name);

}  // namespace kuafu::opt

#include "core/hooks/batch.h"

#include "core/util/error.h"

namespace kuafu::hooks {

const torch::Tensor& Batch::operator[](const std::string& name) const {
  const auto found = features.find(name);
  if (found != features.end()) return found->second;
  std::string present;
  for (const auto& item : features) present += (present.empty() ? "" : ", ") + item.first;
  fail(detail::concat("the batch has no feature '", name, "' (it has: ", present.empty() ? "none" : present, ")"));
}

}  // namespace kuafu::hooks

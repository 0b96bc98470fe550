#include "core/hooks/block_model.h"

namespace kuafu::hooks {

BlockSites& BlockModel::block_sites() {
  if (!sites_made_) use_parts(/*first=*/true, /*last=*/true);
  return sites_;
}

void BlockModel::use_parts(bool first, bool last, const std::function<bool(int64_t)>& holds_block) {
  std::vector<ModelPart> parts;
  if (first) parts.push_back(head_part());
  for (int64_t i = 0; i < num_blocks(); ++i) {
    if (!holds_block || holds_block(i)) parts.push_back(block_part(i));
  }
  if (last) parts.push_back(tail_part());
  sites_ = BlockSites::of_parts(module(), parts);
  sites_made_ = true;
}

}  // namespace kuafu::hooks

// ProcessMesh: the world's ranks laid out on named axes (e.g. pipeline × data × sequence × tensor,
// last axis fastest). It checks the degrees multiply to the world size and owns every sub-group.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dist/process_group.h"

namespace kuafu::dist {

struct MeshAxis {
  std::string name;
  int size = 1;
};

class ProcessMesh {
 public:
  // Creates one group per axis for this rank (all ranks call this with the same axes, so groups are
  // created in the same order everywhere). Throws when the sizes don't multiply to the world size.
  ProcessMesh(std::shared_ptr<World> world, std::vector<MeshAxis> axes);

  int size(const std::string& axis) const;
  int coordinate(const std::string& axis) const;  // this rank's index along `axis`
  const std::vector<MeshAxis>& axes() const { return axes_; }
  const World& world() const { return *world_; }
  std::shared_ptr<World> world_ptr() const { return world_; }

  // The group of ranks that differ from this one only along `axes` (one axis, or several, e.g.
  // {"data", "sequence"} for gradient averaging). Multi-axis groups are created on first request:
  // every member must request them in the same order.
  GroupPtr group(const std::string& axis) const;
  GroupPtr group(const std::vector<std::string>& axes) const;

  // Global rank at the given coordinates (one per axis, in axis order).
  int rank_at(const std::vector<int>& coordinates) const;
  std::string describe() const;  // "pipeline=1 × data=2 × sequence=1 × tensor=2 (rank 3 at [0,1,0,1])"

 private:
  int axis_index(const std::string& axis) const;
  GroupPtr make_group(const std::vector<int>& axis_indices) const;

  std::shared_ptr<World> world_;
  std::vector<MeshAxis> axes_;
  std::vector<int> coordinates_;
  mutable std::map<std::vector<int>, GroupPtr> groups_;  // key: sorted axis indices
};

}  // namespace kuafu::dist

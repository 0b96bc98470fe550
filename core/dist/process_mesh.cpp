#include "core/dist/process_mesh.h"

#include <algorithm>
#include <sstream>

#include "core/util/error.h"

namespace kuafu::dist {

ProcessMesh::ProcessMesh(std::shared_ptr<World> world, std::vector<MeshAxis> axes)
    : world_(std::move(world)), axes_(std::move(axes)) {
  int64_t product = 1;
  std::ostringstream layout;
  for (size_t i = 0; i < axes_.size(); ++i) {
    KUAFU_CHECK(axes_[i].size >= 1, "parallel degree '", axes_[i].name, "' must be >= 1, found ", axes_[i].size);
    product *= axes_[i].size;
    layout << (i ? " x " : "") << axes_[i].name << "=" << axes_[i].size;
  }
  KUAFU_CHECK(product == world_->size(), "parallel degrees ", layout.str(), " multiply to ", product,
              " but the world has ", world_->size(), " ranks; adjust the parallel sizes or the number "
              "of processes");
  // Row-major coordinates: the last axis varies fastest.
  coordinates_.assign(axes_.size(), 0);
  int rest = world_->rank();
  for (size_t i = axes_.size(); i-- > 0;) {
    coordinates_[i] = rest % axes_[i].size;
    rest /= axes_[i].size;
  }
  for (size_t i = 0; i < axes_.size(); ++i) group(axes_[i].name);
}

int ProcessMesh::axis_index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (axes_[i].name == axis) return static_cast<int>(i);
  }
  fail("process mesh has no axis '" + axis + "' (" + describe() + ")");
}

int ProcessMesh::size(const std::string& axis) const { return axes_[axis_index(axis)].size; }
int ProcessMesh::coordinate(const std::string& axis) const { return coordinates_[axis_index(axis)]; }

int ProcessMesh::rank_at(const std::vector<int>& coordinates) const {
  KUAFU_CHECK(coordinates.size() == axes_.size(), "rank_at needs ", axes_.size(), " coordinates");
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) rank = rank * axes_[i].size + coordinates[i];
  return rank;
}

GroupPtr ProcessMesh::group(const std::string& axis) const { return group(std::vector<std::string>{axis}); }

GroupPtr ProcessMesh::group(const std::vector<std::string>& axes) const {
  std::vector<int> indices;
  for (const auto& a : axes) indices.push_back(axis_index(a));
  std::sort(indices.begin(), indices.end());
  indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
  auto found = groups_.find(indices);
  if (found != groups_.end()) return found->second;
  GroupPtr g = make_group(indices);
  groups_.emplace(indices, g);
  return g;
}

GroupPtr ProcessMesh::make_group(const std::vector<int>& axis_indices) const {
  // Members: every combination of coordinates along the chosen axes, this rank's elsewhere.
  std::vector<int> members;
  std::vector<int> coords = coordinates_;
  std::function<void(size_t)> visit = [&](size_t k) {
    if (k == axis_indices.size()) {
      members.push_back(rank_at(coords));
      return;
    }
    const int a = axis_indices[k];
    for (int c = 0; c < axes_[a].size; ++c) {
      coords[a] = c;
      visit(k + 1);
    }
    coords[a] = coordinates_[a];
  };
  visit(0);
  // Name: chosen axes plus this group's fixed coordinates, identical on all members.
  std::ostringstream name;
  for (size_t i = 0; i < axes_.size(); ++i) {
    const bool chosen = std::find(axis_indices.begin(), axis_indices.end(), static_cast<int>(i)) != axis_indices.end();
    name << (i ? "," : "") << axes_[i].name << (chosen ? std::string("=*") : "=" + std::to_string(coordinates_[i]));
  }
  return world_->new_group(name.str(), members);
}

std::string ProcessMesh::describe() const {
  std::ostringstream out;
  for (size_t i = 0; i < axes_.size(); ++i) out << (i ? " x " : "") << axes_[i].name << "=" << axes_[i].size;
  out << " (rank " << world_->rank() << " at [";
  for (size_t i = 0; i < coordinates_.size(); ++i) out << (i ? "," : "") << coordinates_[i];
  out << "])";
  return out.str();
}

}  // namespace kuafu::dist

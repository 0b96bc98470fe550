// A parameter held by several ranks as copies that must stay equal (the token embedding a pipeline's
// first stage looks up and its last stage projects with): each copy's gradient is the sum of all of
// theirs, and one copy counts in the global gradient norm and in checkpoints.
#pragma once

#include <set>
#include <string>

#include "core/dist/process_group.h"

namespace kuafu::train {

struct TiedCopies {
  std::set<std::string> names;  // this rank's parameters that have copies elsewhere; empty: none
  dist::GroupPtr group;         // the ranks holding the copies (null when names is empty)
  bool counted = true;          // this rank's copies are the ones the norm and checkpoints count

  // False for a parameter this rank holds as an uncounted copy.
  bool counts(const std::string& name) const { return counted || names.count(name) == 0; }
};

}  // namespace kuafu::train

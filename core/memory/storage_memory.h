// A tensor's memory given back and taken again while its storage object stays: the parameters and any
// views autograd saved keep pointing at that storage and see data again once it is re-allocated and filled
// (Gemini's released chunks; a frozen weight whose home is the disk tier, between its block's calls).
#pragma once

#include <torch/types.h>

namespace kuafu::memory {

// The storage's memory back to its allocator; the storage holds 0 bytes until allocate_storage.
void free_storage(const torch::Tensor& t);
// Fresh memory for `t`'s storage (its elements' bytes, from the storage's own allocator), unfilled.
void allocate_storage(const torch::Tensor& t);

}  // namespace kuafu::memory

#include "apps/fastfold/chain_atoms.h"

#include <torch/torch.h>

#include "apps/fastfold/residue_types.h"

namespace kuafu::fold {

ChainAtoms chain_atoms(const Chain& chain) {
  std::vector<const Residue*> kept;
  for (const Residue& residue : chain.residues) {
    const bool has_ca = std::any_of(residue.atoms.begin(), residue.atoms.end(), [](const Atom& a) { return a.name == "CA"; });
    if (!residue.hetero && has_ca) kept.push_back(&residue);
  }
  const int64_t n = static_cast<int64_t>(kept.size());
  ChainAtoms out;
  out.aatype = torch::empty({n}, torch::kInt64);
  out.positions = torch::zeros({n, kAtom37, 3});
  out.mask = torch::zeros({n, kAtom37});
  out.residue_index = torch::empty({n}, torch::kInt64);
  auto aatype = out.aatype.accessor<int64_t, 1>();
  auto positions = out.positions.accessor<float, 3>();
  auto mask = out.mask.accessor<float, 2>();
  auto number = out.residue_index.accessor<int64_t, 1>();
  for (int64_t r = 0; r < n; ++r) {
    const char code = one_letter_code(kept[r]->name);
    out.sequence.push_back(code);
    aatype[r] = residue_type_index(code);
    number[r] = kept[r]->number;
    for (const Atom& atom : kept[r]->atoms) {
      const int a = atom37_index(atom.name);
      if (a < 0) continue;
      for (int x = 0; x < 3; ++x) positions[r][a][x] = static_cast<float>(atom.position[x]);
      mask[r][a] = 1.0f;
    }
  }
  return out;
}

}  // namespace kuafu::fold

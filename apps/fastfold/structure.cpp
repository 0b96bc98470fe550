#include "apps/fastfold/structure.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "apps/fastfold/residue_types.h"
#include "apps/fastfold/text_fields.h"
#include "core/util/error.h"

namespace kuafu::fold {
namespace {

// The periodic table's symbols, upper case, for guessing elements from atom names.
bool is_element(std::string_view symbol) {
  static const std::string kSymbols =
      " H HE LI BE B C N O F NE NA MG AL SI P S CL AR K CA SC TI V CR MN FE CO NI CU ZN GA GE AS SE BR KR"
      " RB SR Y ZR NB MO TC RU RH PD AG CD IN SN SB TE I XE CS BA LA CE PR ND PM SM EU GD TB DY HO ER TM"
      " YB LU HF TA W RE OS IR PT AU HG TL PB BI PO AT RN FR RA AC TH PA U NP PU AM CM BK CF ES FM MD NO"
      " LR RF DB SG BH HS MT DS RG CN NH FL MC LV TS OG ";
  return !symbol.empty() && kSymbols.find(" " + std::string(symbol) + " ") != std::string::npos;
}

// biotite's guess (Gromacs and CHARMM files leave the element blank): digits dropped ("1HG2" -> H);
// names starting with C, N, O, S or H are that element, else the first two letters if they are an
// element, else the first letter.
std::string guess_element(std::string_view atom_name) {
  std::string letters;
  for (char c : atom_name) {
    if (!std::isdigit(static_cast<unsigned char>(c))) letters += c;
  }
  letters = upper_case(letters);
  if (letters.empty()) return "";
  if (std::string_view("CNOSH").find(letters[0]) != std::string_view::npos) return letters.substr(0, 1);
  if (letters.size() >= 2 && is_element(letters.substr(0, 2))) return letters.substr(0, 2);
  return is_element(letters.substr(0, 1)) ? letters.substr(0, 1) : "";
}

bool is_water(std::string_view residue_name) { return residue_name == "HOH" || residue_name == "WAT"; }

// The positions the numbering says lie between two neighbouring residues: 0 from 52 to 52A or 53,
// 2 from 52 to 55; -1 when it runs backwards (no hint).
int numbering_step(const Residue& before, const Residue& after) {
  if (after.number == before.number) return after.insertion_code != before.insertion_code ? 0 : -1;
  if (after.number < before.number) return -1;
  return after.number - before.number - 1;
}

}  // namespace

const Chain* Structure::chain(std::string_view id) const {
  for (const Chain& c : chains) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

char one_letter_code(std::string_view residue_name) {
  for (const ResidueType& type : residue_types()) {
    if (residue_name == type.name) return type.code;
  }
  return 'X';
}

StructureBuilder::Place StructureBuilder::add(AtomRecord r) {
  if (r.hetero && is_water(r.residue_name)) return {};
  if (r.atom.element.empty()) r.atom.element = guess_element(r.atom.name);
  const std::string read_name = r.residue_name;
  bool same_residue = false;
  if (current_.chain >= 0) {
    const Chain& chain = chains_[size_t(current_.chain)];
    const Residue& residue = chain.residues[size_t(current_.residue)];
    same_residue = chain.id == r.chain_id && residue.number == r.residue_number &&
                   residue.insertion_code == r.insertion_code;
    // Another residue name at the same place: an alternative residue when it has an altloc (the
    // first one read stays), else a residue of its own that happens to share the number.
    if (same_residue && read_name != current_name_) {
      if (r.altloc != ' ') return {};
      same_residue = false;
    }
  }
  if (r.residue_name == "MSE") {
    r.residue_name = "MET";
    r.hetero = false;
    if (r.atom.name == "SE") r.atom.name = "SD";
  }
  if (!same_residue) {
    auto chain = std::find_if(chains_.begin(), chains_.end(), [&](const Chain& c) { return c.id == r.chain_id; });
    if (chain == chains_.end()) chain = chains_.insert(chains_.end(), Chain{r.chain_id, {}, {}, {}});
    chain->residues.push_back(Residue{r.residue_name, r.residue_number, r.insertion_code, r.hetero, {}});
    current_ = {int(chain - chains_.begin()), int(chain->residues.size()) - 1};
    current_name_ = read_name;
  }
  std::vector<Atom>& atoms = chains_[size_t(current_.chain)].residues[size_t(current_.residue)].atoms;
  auto same = std::find_if(atoms.begin(), atoms.end(), [&](const Atom& a) { return a.name == r.atom.name; });
  if (same == atoms.end()) {
    atoms.push_back(std::move(r.atom));
  } else if (r.atom.occupancy > same->occupancy) {
    *same = std::move(r.atom);  // a later alternative location of higher occupancy
  }
  return current_;
}

void match_sequence(Chain& chain, std::vector<std::string> sequence, const std::string& file) {
  const size_t n = chain.residues.size(), m = sequence.size();
  chain.sequence_to_residue.assign(m, -1);
  chain.sequence = std::move(sequence);
  if (n == 0 || m == 0) return;
  KUAFU_CHECK(n * m <= 50'000'000 && n < 40'000, file, ": chain '", chain.id, "' has ", n,
              " residues with coordinates and a sequence of ", m, ": too many to match");
  // Scores: a match is worth more than every agreeing step together can be.
  const int32_t match = int32_t(n) + 1;
  std::vector<int32_t> step(n, -1);
  for (size_t i = 1; i < n; ++i) step[i] = numbering_step(chain.residues[i - 1], chain.residues[i]);
  // score[i, j]: best alignment of residues ..i and positions ..j with i at j (0: i is not j's name);
  // best[i, j]: the best score at or above-left of (i, j). 8 bytes a cell: 400 MB at the limit above.
  std::vector<int32_t> score(n * m, 0), best(n * m, 0);
  auto at = [m](size_t i, size_t j) { return i * m + j; };
  auto agreeing = [&](size_t i, size_t j) -> int64_t {  // where i - 1 stands when the step agrees; -1: none
    if (i == 0 || step[i] < 0 || j < size_t(step[i]) + 1) return -1;
    const size_t before = j - 1 - size_t(step[i]);
    return score[at(i - 1, before)] > 0 ? int64_t(before) : -1;
  };
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < m; ++j) {
      if (chain.residues[i].name == chain.sequence[j]) {
        int32_t before = i > 0 && j > 0 ? best[at(i - 1, j - 1)] : 0;
        if (const int64_t k = agreeing(i, j); k >= 0) before = std::max(before, score[at(i - 1, size_t(k))] + 1);
        score[at(i, j)] = match + before;
      }
      int32_t b = score[at(i, j)];
      if (i > 0) b = std::max(b, best[at(i - 1, j)]);
      if (j > 0) b = std::max(b, best[at(i, j - 1)]);
      best[at(i, j)] = b;
    }
  }
  // Back from the best cell: where best[i, j] came from, then each match's predecessor.
  auto find = [&](size_t i, size_t j, int32_t value, size_t& found_i, size_t& found_j) {
    while (true) {
      if (score[at(i, j)] == value) break;
      if (i > 0 && best[at(i - 1, j)] == value) {
        --i;
      } else {
        --j;
      }
    }
    found_i = i, found_j = j;
  };
  int32_t value = best[at(n - 1, m - 1)];
  size_t i = n - 1, j = m - 1;
  while (value > 0) {
    find(i, j, value, i, j);
    chain.sequence_to_residue[j] = int(i);
    const int32_t before = value - match;
    if (before == 0) break;
    if (const int64_t k = agreeing(i, j); k >= 0 && score[at(i - 1, size_t(k))] + 1 == before) {
      value = score[at(i - 1, size_t(k))];
      i = i - 1, j = size_t(k);
    } else {
      value = before;
      i = i - 1, j = j - 1;
    }
  }
}

}  // namespace kuafu::fold

#include "apps/fastfold/pdb_file.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>

#include "core/util/atomic_file.h"
#include "core/util/text.h"

namespace kuafu::fold {
namespace {

std::string_view trim(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// Columns `first`..`last` (1-based, inclusive, as the PDB format documents them); shorter when the
// line ends before.
std::string_view columns(std::string_view line, size_t first, size_t last) {
  if (line.size() < first) return {};
  return line.substr(first - 1, last - first + 1);
}

char column(std::string_view line, size_t at) { return line.size() >= at ? line[at - 1] : ' '; }

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

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
  letters = upper(letters);
  if (letters.empty()) return "";
  if (std::string_view("CNOSH").find(letters[0]) != std::string_view::npos) return letters.substr(0, 1);
  if (letters.size() >= 2 && is_element(letters.substr(0, 2))) return letters.substr(0, 2);
  return is_element(letters.substr(0, 1)) ? letters.substr(0, 1) : "";
}

// Residue numbers past 9999 in 4 columns, as biotite, OpenMM and others write them: "A000" is 10000,
// "ZZZZ" 1223055, "a000" 1223056 (base 36 with an offset, upper then lower case).
std::optional<int> parse_residue_number(std::string_view field) {
  if (const auto decimal = parse_integer(field)) return decimal;
  if (field.size() != 4) return std::nullopt;
  const bool upper_case = std::isupper(static_cast<unsigned char>(field[0]));
  if (!upper_case && !std::islower(static_cast<unsigned char>(field[0]))) return std::nullopt;
  int value = 0;
  for (char c : field) {
    int digit = -1;
    if (std::isdigit(static_cast<unsigned char>(c))) digit = c - '0';
    if (upper_case && c >= 'A' && c <= 'Z') digit = c - 'A' + 10;
    if (!upper_case && c >= 'a' && c <= 'z') digit = c - 'a' + 10;
    if (digit < 0) return std::nullopt;
    value = value * 36 + digit;
  }
  return upper_case ? value - 10 * 36 * 36 * 36 + 10000 : value + 16 * 36 * 36 * 36 + 10000;
}

bool is_water(std::string_view residue_name) { return residue_name == "HOH" || residue_name == "WAT"; }

// The positions the numbering says lie between two neighbouring residues: 0 from 52 to 52A or 53,
// 2 from 52 to 55; -1 when it runs backwards (no hint).
int numbering_step(const Residue& before, const Residue& after) {
  if (after.number == before.number) return after.insertion_code != before.insertion_code ? 0 : -1;
  if (after.number < before.number) return -1;
  return after.number - before.number - 1;
}

// A PDB line of ATOM or HETATM, read into a record; every field that cannot be read names its columns.
class AtomLine {
 public:
  AtomLine(std::string_view line, const std::string& file, size_t number) : line_(line), file_(file), number_(number) {}

  AtomRecord read() const {
    const std::string_view record = trim(columns(line_, 1, 6));
    if (line_.size() < 66) {
      fail(detail::concat("expected an ", record, " record through column 66 (the B-factor), but the line ends at column ",
                          line_.size()));
    }
    AtomRecord r;
    r.hetero = record == "HETATM";
    r.atom.name = std::string(required(13, 16, "an atom name"));
    r.altloc = column(line_, 17);
    r.residue_name = std::string(required(18, 20, "a residue name"));
    r.chain_id = std::string(trim(columns(line_, 22, 22)));
    const auto number = parse_residue_number(columns(line_, 23, 26));
    if (!number) {
      fail(detail::concat("expected a residue number (an integer, hybrid-36 past 9999) in columns 23-26, found '",
                          columns(line_, 23, 26), "'"));
    }
    r.residue_number = *number;
    r.insertion_code = column(line_, 27);
    r.atom.position = {decimal(31, 38, "the x coordinate"), decimal(39, 46, "the y coordinate"),
                       decimal(47, 54, "the z coordinate")};
    r.atom.occupancy = decimal(55, 60, "the occupancy");
    r.atom.b_factor = decimal(61, 66, "the B-factor");
    r.atom.element = upper(trim(columns(line_, 77, 78)));  // StructureBuilder guesses it when blank
    return r;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { fail_at_line(file_, number_, message); }

  std::string_view required(size_t first, size_t last, const char* what) const {
    const std::string_view field = trim(columns(line_, first, last));
    if (field.empty()) fail(detail::concat("expected ", what, " in columns ", first, "-", last, ", found blanks"));
    return field;
  }
  double decimal(size_t first, size_t last, const char* what) const {
    const auto value = parse_decimal(columns(line_, first, last));
    if (!value) {
      fail(detail::concat("expected a number for ", what, " in columns ", first, "-", last, ", found '",
                          columns(line_, first, last), "'"));
    }
    return *value;
  }

  std::string_view line_;
  const std::string& file_;
  size_t number_;
};

// SEQRES records of one chain as they accumulate.
struct SeqRes {
  size_t first_line = 0;
  int count = 0;  // what columns 14-17 say
  std::vector<std::string> names;
};

void read_seqres(std::string_view line, const std::string& file, size_t number, std::map<std::string, SeqRes>& all) {
  const auto count = parse_integer(columns(line, 14, 17));
  if (!count) {
    fail_at_line(file, number, detail::concat("expected the residue count of a SEQRES record in columns 14-17, found '",
                                              columns(line, 14, 17), "'"));
  }
  SeqRes& chain = all[std::string(trim(columns(line, 12, 12)))];
  if (chain.names.empty()) chain.first_line = number, chain.count = *count;
  const std::string_view names = line.size() > 19 ? line.substr(19) : std::string_view();
  for (const std::string& name : text::split(std::string(trim(names)), ' ')) {
    if (!name.empty()) chain.names.push_back(name == "MSE" ? "MET" : name);
  }
}

// Fixed-width fields; a value that does not fit is refused rather than shifting the columns.
std::string fixed(double value, int width, const char* what, const Structure& structure) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%*.*f", width, width == 8 ? 3 : 2, value);
  KUAFU_CHECK(std::string_view(buffer).size() == size_t(width) && std::isfinite(value), structure.path,
              ": cannot write ", what, " ", value, " into PDB's ", width, " columns (write mmCIF instead)");
  return buffer;
}

// Columns 13-16: a one-letter element's name starts at column 14 (" CA "), a longer name or a
// two-letter element's at 13 ("FE  ", "HG21").
std::string atom_name_field(const Atom& atom) {
  if (atom.name.size() < 4 && atom.element.size() < 2) return " " + atom.name + std::string(3 - atom.name.size(), ' ');
  return atom.name + std::string(4 - atom.name.size(), ' ');
}

}  // namespace

void fail_at_line(const std::string& file, size_t line, const std::string& message) {
  throw Error(detail::concat(file, ":", line, ": ", message));
}

std::optional<double> parse_decimal(std::string_view field) {
  field = trim(field);
  if (!field.empty() && field[0] == '+') field.remove_prefix(1);
  if (field.empty() || field.find_first_not_of("0123456789+-.eE") != std::string_view::npos) return std::nullopt;
  double value = 0;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (error != std::errc() || end != field.data() + field.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<int> parse_integer(std::string_view field) {
  field = trim(field);
  if (!field.empty() && field[0] == '+') field.remove_prefix(1);
  int value = 0;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (field.empty() || error != std::errc() || end != field.data() + field.size()) return std::nullopt;
  return value;
}

const Chain* Structure::chain(std::string_view id) const {
  for (const Chain& c : chains) {
    if (c.id == id) return &c;
  }
  return nullptr;
}

char one_letter_code(std::string_view residue_name) {
  static const std::pair<const char*, char> kCodes[] = {
      {"ALA", 'A'}, {"ARG", 'R'}, {"ASN", 'N'}, {"ASP", 'D'}, {"CYS", 'C'}, {"GLN", 'Q'}, {"GLU", 'E'},
      {"GLY", 'G'}, {"HIS", 'H'}, {"ILE", 'I'}, {"LEU", 'L'}, {"LYS", 'K'}, {"MET", 'M'}, {"PHE", 'F'},
      {"PRO", 'P'}, {"SER", 'S'}, {"THR", 'T'}, {"TRP", 'W'}, {"TYR", 'Y'}, {"VAL", 'V'}};
  for (const auto& [name, code] : kCodes) {
    if (residue_name == name) return code;
  }
  return 'X';
}

std::string read_text_file(const std::string& path) {
  if (!text::ends_with(path, ".gz")) return read_file(path);
  gzFile in = gzopen(path.c_str(), "rb");
  KUAFU_CHECK(in != nullptr, "cannot open ", path);
  std::string text;
  char buffer[1 << 16];
  int n = 0;
  while ((n = gzread(in, buffer, sizeof buffer)) > 0) text.append(buffer, size_t(n));
  int status = Z_OK;
  const std::string error = n < 0 ? gzerror(in, &status) : "";
  gzclose(in);
  KUAFU_CHECK(n == 0, path, ": cannot decompress: ", error, " (after ", text.size(), " bytes)");
  return text;
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

Structure parse_pdb(std::string_view text, const std::string& name) {
  Structure structure;
  structure.path = name;
  StructureBuilder builder;
  std::map<std::string, SeqRes> seqres;
  int model_records = 0;
  bool first_model_done = false;
  size_t number = 0;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::string_view record = columns(line, 1, 6);
    if (trim(record) == "ATOM" || record == "HETATM") {
      AtomRecord r = AtomLine(line, name, number).read();  // every model's lines are checked
      if (!first_model_done) builder.add(std::move(r));
    } else if (text::starts_with(record, "MODEL")) {
      if (++model_records > 1) first_model_done = true;
    } else if (record == "ENDMDL") {
      first_model_done = true;
    } else if (record == "SEQRES") {
      read_seqres(line, name, number, seqres);
    } else if (trim(record) == "END") {
      break;
    }
  }
  structure.num_models = std::max(1, model_records);
  structure.chains = builder.finish();
  KUAFU_CHECK(!structure.chains.empty(), name, ": no ATOM or HETATM records (other than waters): not a PDB file?");
  for (auto& [id, entry] : seqres) {
    if (int(entry.names.size()) != entry.count) {
      fail_at_line(name, entry.first_line,
                   detail::concat("the SEQRES records of chain '", id, "' list ", entry.names.size(),
                                  " residues, but their count (columns 14-17) says ", entry.count));
    }
    for (Chain& chain : structure.chains) {
      if (chain.id == id) match_sequence(chain, std::move(entry.names), name);
    }
  }
  return structure;
}

Structure read_pdb(const std::string& path) { return parse_pdb(read_text_file(path), path); }

std::string format_pdb(const Structure& structure) {
  std::string out;
  char line[128];
  auto check = [&](bool fits, const auto&... what) {
    KUAFU_CHECK(fits, structure.path, ": cannot write ", what..., " in PDB's columns (write mmCIF instead)");
  };
  for (const Chain& chain : structure.chains) {
    check(chain.id.size() <= 1, "chain id '", chain.id, "'");
    const char id = chain.id.empty() ? ' ' : chain.id[0];
    const size_t count = chain.sequence.size();
    check(count <= 9999, "a sequence of ", count, " residues");
    for (size_t first = 0, serial = 1; first < count; first += 13, ++serial) {
      int at = std::snprintf(line, sizeof line, "SEQRES %3zu %c %4zu  ", serial, id, count);
      for (size_t k = first; k < std::min(count, first + 13); ++k) {
        check(chain.sequence[k].size() <= 3, "residue name '", chain.sequence[k], "'");
        at += std::snprintf(line + at, sizeof line - size_t(at), "%3s ", chain.sequence[k].c_str());
      }
      out += std::string(line, size_t(at)) + std::string(80 - size_t(at), ' ') + "\n";
    }
  }
  size_t serial = 0;
  for (const Chain& chain : structure.chains) {
    const char id = chain.id.empty() ? ' ' : chain.id[0];
    for (const Residue& residue : chain.residues) {
      check(residue.name.size() <= 3, "residue name '", residue.name, "'");
      check(residue.number >= -999 && residue.number <= 9999, "residue number ", residue.number);
      for (const Atom& atom : residue.atoms) {
        check(++serial <= 99999, "more than 99,999 atoms");
        check(atom.name.size() <= 4 && atom.element.size() <= 2, "atom '", atom.name, "' (", atom.element, ")");
        const std::string coordinates = fixed(atom.position[0], 8, "coordinate", structure) +
                                        fixed(atom.position[1], 8, "coordinate", structure) +
                                        fixed(atom.position[2], 8, "coordinate", structure);
        std::snprintf(line, sizeof line, "%-6s%5zu %s %3s %c%4d%c   %s%s%s          %2s  \n",
                      residue.hetero ? "HETATM" : "ATOM", serial, atom_name_field(atom).c_str(), residue.name.c_str(),
                      id, residue.number, residue.insertion_code, coordinates.c_str(),
                      fixed(atom.occupancy, 6, "occupancy", structure).c_str(),
                      fixed(atom.b_factor, 6, "B-factor", structure).c_str(), atom.element.c_str());
        out += line;
      }
    }
    if (!chain.residues.empty()) {
      const Residue& last = chain.residues.back();
      check(++serial <= 99999, "more than 99,999 atoms");
      const int at = std::snprintf(line, sizeof line, "TER   %5zu      %3s %c%4d%c", serial, last.name.c_str(), id,
                                   last.number, last.insertion_code);
      out += std::string(line, size_t(at)) + std::string(80 - size_t(at), ' ') + "\n";
    }
  }
  out += "END" + std::string(77, ' ') + "\n";
  return out;
}

void write_pdb(const Structure& structure, const std::string& path) { write_file_atomic(path, format_pdb(structure)); }

}  // namespace kuafu::fold

#include "apps/fastfold/pdb_file.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>

#include "core/util/atomic_file.h"
#include "core/util/text.h"

namespace kuafu::fold {
namespace {

// Columns `first`..`last` (1-based, inclusive, as the PDB format documents them); shorter when the
// line ends before.
std::string_view columns(std::string_view line, size_t first, size_t last) {
  if (line.size() < first) return {};
  return line.substr(first - 1, last - first + 1);
}

char column(std::string_view line, size_t at) { return line.size() >= at ? line[at - 1] : ' '; }

// Residue numbers past 9999 in 4 columns, as biotite, OpenMM and others write them: "A000" is 10000,
// "ZZZZ" 1223055, "a000" 1223056 (base 36 with an offset, upper then lower case).
std::optional<int> parse_residue_number(std::string_view field) {
  if (const auto decimal = parse_integer(field)) return decimal;
  if (field.size() != 4) return std::nullopt;
  const bool upper_digits = std::isupper(static_cast<unsigned char>(field[0]));
  if (!upper_digits && !std::islower(static_cast<unsigned char>(field[0]))) return std::nullopt;
  int value = 0;
  for (char c : field) {
    int digit = -1;
    if (std::isdigit(static_cast<unsigned char>(c))) digit = c - '0';
    if (upper_digits && c >= 'A' && c <= 'Z') digit = c - 'A' + 10;
    if (!upper_digits && c >= 'a' && c <= 'z') digit = c - 'a' + 10;
    if (digit < 0) return std::nullopt;
    value = value * 36 + digit;
  }
  return upper_digits ? value - 10 * 36 * 36 * 36 + 10000 : value + 16 * 36 * 36 * 36 + 10000;
}

// A PDB line of ATOM or HETATM, read into a record; every field that cannot be read names its columns.
class AtomLine {
 public:
  AtomLine(std::string_view line, const std::string& file, size_t number) : line_(line), file_(file), number_(number) {}

  AtomRecord read() const {
    const std::string_view record = trim_field(columns(line_, 1, 6));
    if (line_.size() < 66) {
      fail(detail::concat("expected an ", record, " record through column 66 (the B-factor), but the line ends at column ",
                          line_.size()));
    }
    AtomRecord r;
    r.hetero = record == "HETATM";
    r.atom.name = std::string(required(13, 16, "an atom name"));
    r.altloc = column(line_, 17);
    r.residue_name = std::string(required(18, 20, "a residue name"));
    r.chain_id = std::string(trim_field(columns(line_, 22, 22)));
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
    r.atom.element = upper_case(trim_field(columns(line_, 77, 78)));  // StructureBuilder guesses it when blank
    return r;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { fail_at_line(file_, number_, message); }

  std::string_view required(size_t first, size_t last, const char* what) const {
    const std::string_view field = trim_field(columns(line_, first, last));
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
  SeqRes& chain = all[std::string(trim_field(columns(line, 12, 12)))];
  if (chain.names.empty()) chain.first_line = number, chain.count = *count;
  const std::string_view names = line.size() > 19 ? line.substr(19) : std::string_view();
  for (const std::string& name : text::split(std::string(trim_field(names)), ' ')) {
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
    if (trim_field(record) == "ATOM" || record == "HETATM") {
      AtomRecord r = AtomLine(line, name, number).read();  // every model's lines are checked
      if (!first_model_done) builder.add(std::move(r));
    } else if (text::starts_with(record, "MODEL")) {
      if (++model_records > 1) first_model_done = true;
    } else if (record == "ENDMDL") {
      first_model_done = true;
    } else if (record == "SEQRES") {
      read_seqres(line, name, number, seqres);
    } else if (trim_field(record) == "END") {
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

#include "apps/fastfold/mmcif_file.h"

#include <cctype>
#include <map>
#include <set>
#include <utility>

#include "core/util/text.h"

namespace kuafu::fold {

std::string_view CifColumn::operator[](size_t row) const { return values_[row].null ? std::string_view() : raw(row); }

std::string_view CifColumn::raw(size_t row) const {
  return std::string_view(*text_).substr(values_[row].begin, values_[row].size);
}

const CifColumn* CifBlock::find(std::string_view tag) const {
  std::string key(tag);
  for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto it = columns_.find(key);
  return it == columns_.end() ? nullptr : &it->second;
}

// CIF 1.1's syntax, as much of it as PDB's files use.
class CifParser {
 public:
  CifParser(std::string text, const std::string& file) : text_(std::make_shared<std::string>(std::move(text))) {
    block_.text_ = text_;
    block_.file_ = file;
  }

  CifBlock parse() {
    Token t = next();
    while (t.kind != Token::kData) {
      if (t.kind == Token::kEnd) fail(line_, "expected a data_ block, found none (not a CIF file?)");
      if (t.kind != Token::kSave) fail(t.line, "expected data_ before '" + std::string(word(t)) + "'");
      t = skip_save_frame(t);
    }
    block_.name_ = std::string(word(t).substr(5));
    t = next();
    while (t.kind != Token::kEnd && t.kind != Token::kData) {
      switch (t.kind) {
        case Token::kTag: {
          const Token value = next();
          if (value.kind != Token::kValue) fail(t.line, "expected a value for " + std::string(word(t)));
          column(t).values_.push_back(as_value(value));
          t = next();
          break;
        }
        case Token::kLoop:
          t = loop(t);
          break;
        case Token::kSave:
          t = skip_save_frame(t);
          break;
        default:
          fail(t.line, "expected a tag, loop_ or data_, found the value '" + std::string(word(t)) + "'");
      }
    }
    return std::move(block_);
  }

 private:
  struct Token {
    enum Kind { kValue, kTag, kLoop, kData, kSave, kEnd } kind = kEnd;
    size_t begin = 0, size = 0;
    uint32_t line = 0;
    bool null = false;
  };

  [[noreturn]] void fail(size_t line, const std::string& message) const { fail_at_line(block_.file_, line, message); }

  std::string_view word(const Token& t) const { return std::string_view(*text_).substr(t.begin, t.size); }

  static std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  }

  static bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

  static CifColumn::Value as_value(const Token& t) { return {t.begin, uint32_t(t.size), t.line, t.null}; }

  // The column of a tag not seen before.
  CifColumn& column(const Token& tag) {
    const auto [it, added] = block_.columns_.try_emplace(lower(word(tag)));
    if (!added) {
      fail(tag.line, detail::concat(word(tag), " is given twice (first at line ", it->second.values_.empty() ? 0 :
                                                                                     it->second.values_[0].line, ")"));
    }
    it->second.text_ = text_.get();
    return it->second;
  }

  Token next() {
    const std::string& s = *text_;
    while (pos_ < s.size()) {
      const char c = s[pos_];
      if (c == '\n') {
        ++line_, ++pos_;
      } else if (space(c)) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s.size() && s[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
    Token t;
    t.line = line_;
    if (pos_ == s.size()) return t;
    const char c = s[pos_];
    if (c == ';' && (pos_ == 0 || s[pos_ - 1] == '\n')) return text_field();
    if (c == '\'' || c == '"') return quoted(c);
    t.begin = pos_;
    while (pos_ < s.size() && !space(s[pos_])) ++pos_;
    t.size = pos_ - t.begin;
    const std::string_view w = word(t);
    const std::string low = lower(w.substr(0, 7));
    if (w[0] == '_') {
      t.kind = Token::kTag;
    } else if (low == "loop_") {
      t.kind = Token::kLoop;
    } else if (text::starts_with(low, "data_")) {
      t.kind = Token::kData;
    } else if (text::starts_with(low, "save_")) {
      t.kind = Token::kSave;
    } else if (low == "global_" || low == "stop_") {
      fail(t.line, "'" + std::string(w) + "' is a reserved word that mmCIF does not use");
    } else {
      t.kind = Token::kValue;
      t.null = w == "." || w == "?";
    }
    return t;
  }

  // 'it''s' rules: a quote closes only where whitespace follows it; a quoted value never spans lines.
  Token quoted(char quote) {
    const std::string& s = *text_;
    Token t;
    t.kind = Token::kValue;
    t.line = line_;
    t.begin = pos_ + 1;
    for (size_t k = t.begin; k < s.size() && s[k] != '\n'; ++k) {
      if (s[k] == quote && (k + 1 == s.size() || space(s[k + 1]))) {
        t.size = k - t.begin;
        pos_ = k + 1;
        return t;
      }
    }
    fail(line_, detail::concat("unterminated quoted value: expected a closing ", quote, " before the end of the line"));
  }

  // From a ';' that starts a line to the next line that starts with ';'.
  Token text_field() {
    const std::string& s = *text_;
    Token t;
    t.kind = Token::kValue;
    t.line = line_;
    t.begin = pos_ + 1;
    const size_t close = s.find("\n;", pos_);
    if (close == std::string::npos) {
      fail(line_, "a text field opens here (a line starting with ';'), but no line starting with ';' closes it");
    }
    t.size = close - t.begin;
    if (t.size > 0 && s[close - 1] == '\r') --t.size;
    for (size_t k = pos_; k <= close; ++k) line_ += s[k] == '\n';
    pos_ = close + 2;
    return t;
  }

  Token loop(const Token& start) {
    std::vector<CifColumn*> columns;
    Token t = next();
    while (t.kind == Token::kTag) {
      columns.push_back(&column(t));
      t = next();
    }
    if (columns.empty()) fail(start.line, "expected the tags of the loop_ that starts here");
    size_t count = 0;
    for (; t.kind == Token::kValue; t = next(), ++count) columns[count % columns.size()]->values_.push_back(as_value(t));
    if (count == 0 || count % columns.size() != 0) {
      fail(start.line, detail::concat("the loop_ that starts here has ", columns.size(), " tags, but its ", count,
                                      " values do not fill whole rows (", count % columns.size(),
                                      " left over; the values end at line ", t.line, ")"));
    }
    return t;
  }

  Token skip_save_frame(Token t) {
    const size_t opened = t.line;
    while (true) {
      t = next();
      if (t.kind == Token::kEnd) fail(opened, "a save_ frame opens here but never closes");
      if (t.kind == Token::kSave && t.size == 5) return next();
    }
  }

  std::shared_ptr<std::string> text_;
  CifBlock block_;
  size_t pos_ = 0;
  uint32_t line_ = 1;
};

CifBlock parse_cif(std::string text, const std::string& file) { return CifParser(std::move(text), file).parse(); }

namespace {

// _atom_site's columns, each with the twin it falls back to.
struct AtomSite {
  const CifBlock& block;
  const CifColumn* group = nullptr;
  const CifColumn *atom, *residue, *chain, *number, *x, *y, *z;
  const CifColumn* element = nullptr;
  const CifColumn* altloc = nullptr;
  const CifColumn* insertion = nullptr;
  const CifColumn* occupancy = nullptr;
  const CifColumn* b_factor = nullptr;
  const CifColumn* model = nullptr;
  const CifColumn* label_asym = nullptr;
  const CifColumn* label_seq = nullptr;
  const CifColumn* label_entity = nullptr;

  explicit AtomSite(const CifBlock& b) : block(b) {
    group = find("group_PDB");
    atom = required("label_atom_id", "auth_atom_id");
    residue = required("label_comp_id", "auth_comp_id");
    chain = required("auth_asym_id", "label_asym_id");
    number = required("auth_seq_id", "label_seq_id");
    x = required("Cartn_x", "Cartn_x");
    y = required("Cartn_y", "Cartn_y");
    z = required("Cartn_z", "Cartn_z");
    element = find("type_symbol");
    altloc = find("label_alt_id");
    insertion = find("pdbx_PDB_ins_code");
    occupancy = find("occupancy");
    b_factor = find("B_iso_or_equiv");
    model = find("pdbx_PDB_model_num");
    label_asym = find("label_asym_id");
    label_seq = find("label_seq_id");
    label_entity = find("label_entity_id");
    for (const CifColumn* c : {group, element, altloc, insertion, occupancy, b_factor, model, label_asym, label_seq,
                               label_entity, atom, residue, chain, number, y, z}) {
      KUAFU_CHECK(c == nullptr || c->size() == x->size(), block.file(),
                  ": the columns of _atom_site differ in length (not one loop)");
    }
  }

  const CifColumn* find(const char* name) const { return block.find(std::string("_atom_site.") + name); }
  const CifColumn* required(const char* name, const char* twin) const {
    const CifColumn* c = find(name);
    if (c == nullptr) c = find(twin);
    const std::string either = std::string_view(name) == twin ? name : detail::concat(name, " or ", twin);
    KUAFU_CHECK(c != nullptr, block.file(), ": _atom_site has no ", either, " column: not a structure file?");
    return c;
  }

  [[noreturn]] void fail(const CifColumn& c, size_t row, const char* tag, const char* expected) const {
    fail_at_line(block.file(), c.line(row),
                 detail::concat("expected ", expected, " for _atom_site.", tag, " (atom ", row + 1, "), found '",
                                c.raw(row), "'"));
  }
  std::string text(const CifColumn& c, size_t row, const char* tag) const {
    if (c.is_null(row)) fail(c, row, tag, "a value");
    return std::string(c[row]);
  }
  double decimal(const CifColumn& c, size_t row, const char* tag) const {
    const auto value = c.is_null(row) ? std::nullopt : parse_decimal(c[row]);
    if (!value) fail(c, row, tag, "a number");
    return *value;
  }
  char code(const CifColumn* c, size_t row, const char* tag) const {  // one character; ' ' when null
    if (c == nullptr || c->is_null(row)) return ' ';
    if ((*c)[row].size() != 1) fail(*c, row, tag, "one character");
    return (*c)[row][0];
  }
};

std::string key(std::string_view asym, int seq) { return detail::concat(asym, ' ', seq); }

// The full sequence of each polymer, by label_asym_id: its monomers and their keys.
struct Polymer {
  std::string asym;
  std::string chain;  // auth chain id ("" when unknown yet)
  std::vector<std::string> names;
  std::vector<int> seq_ids;
};

int seq_id(const CifBlock& block, const CifColumn& c, size_t row, const char* tag) {
  const auto value = c.is_null(row) ? std::nullopt : parse_integer(c[row]);
  if (!value) {
    fail_at_line(block.file(), c.line(row), detail::concat("expected an integer for ", tag, ", found '", c.raw(row), "'"));
  }
  return *value;
}

void add_monomer(Polymer& p, std::string name, int seq) {
  if (!p.seq_ids.empty() && p.seq_ids.back() == seq) return;  // microheterogeneity: the first stays
  p.names.push_back(name == "MSE" ? "MET" : std::move(name));
  p.seq_ids.push_back(seq);
}

std::vector<Polymer> polymers_from_scheme(const CifBlock& block) {
  const CifColumn* asym = block.find("_pdbx_poly_seq_scheme.asym_id");
  const CifColumn* seq = block.find("_pdbx_poly_seq_scheme.seq_id");
  const CifColumn* mon = block.find("_pdbx_poly_seq_scheme.mon_id");
  const CifColumn* strand = block.find("_pdbx_poly_seq_scheme.pdb_strand_id");
  if (!asym || !seq || !mon || !strand) return {};
  std::vector<Polymer> polymers;
  for (size_t row = 0; row < asym->size(); ++row) {
    if (polymers.empty() || polymers.back().asym != (*asym)[row]) {
      polymers.push_back({std::string((*asym)[row]), std::string((*strand)[row]), {}, {}});
    }
    add_monomer(polymers.back(), std::string((*mon)[row]), seq_id(block, *seq, row, "_pdbx_poly_seq_scheme.seq_id"));
  }
  return polymers;
}

std::vector<Polymer> polymers_from_entities(const CifBlock& block, const AtomSite& site,
                                            const std::map<std::string, std::string>& auth_chain_of) {
  const CifColumn* entity = block.find("_entity_poly_seq.entity_id");
  const CifColumn* num = block.find("_entity_poly_seq.num");
  const CifColumn* mon = block.find("_entity_poly_seq.mon_id");
  if (!entity || !num || !mon) return {};
  std::map<std::string, Polymer> sequences;  // by entity
  for (size_t row = 0; row < entity->size(); ++row) {
    add_monomer(sequences[std::string((*entity)[row])], std::string((*mon)[row]),
                seq_id(block, *num, row, "_entity_poly_seq.num"));
  }
  // Entity -> its chains (label_asym_id): _struct_asym, else what _atom_site says.
  std::vector<std::pair<std::string, std::string>> asyms;  // (asym, entity) in file order
  const CifColumn* struct_asym = block.find("_struct_asym.id");
  const CifColumn* struct_entity = block.find("_struct_asym.entity_id");
  if (struct_asym && struct_entity) {
    for (size_t row = 0; row < struct_asym->size(); ++row) {
      asyms.emplace_back(std::string((*struct_asym)[row]), std::string((*struct_entity)[row]));
    }
  } else if (site.label_asym && site.label_entity) {
    std::set<std::string> seen;
    for (size_t row = 0; row < site.label_asym->size(); ++row) {
      if (seen.insert(std::string((*site.label_asym)[row])).second) {
        asyms.emplace_back(std::string((*site.label_asym)[row]), std::string((*site.label_entity)[row]));
      }
    }
  }
  std::vector<Polymer> polymers;
  for (const auto& [asym, entity_id] : asyms) {
    const auto sequence = sequences.find(entity_id);
    const auto chain = auth_chain_of.find(asym);
    if (sequence == sequences.end() || chain == auth_chain_of.end()) continue;
    Polymer p = sequence->second;
    p.asym = asym;
    p.chain = chain->second;
    polymers.push_back(std::move(p));
  }
  return polymers;
}

}  // namespace

Structure parse_mmcif(std::string text, const std::string& file) {
  const CifBlock block = parse_cif(std::move(text), file);
  KUAFU_CHECK(block.find("_atom_site.Cartn_x") != nullptr, file, ": no _atom_site loop (data_", block.name(),
              "): not a structure file?");
  const AtomSite site(block);
  Structure structure;
  structure.path = file;
  StructureBuilder builder;
  std::set<std::string> models;
  std::map<std::string, std::string> auth_chain_of;                 // label_asym_id -> auth_asym_id
  std::unordered_map<std::string, StructureBuilder::Place> placed;  // label asym + seq -> residue
  for (size_t row = 0; row < site.x->size(); ++row) {
    if (site.model != nullptr) {
      models.insert(std::string((*site.model)[row]));
      if ((*site.model)[row] != (*site.model)[0]) continue;
    }
    AtomRecord r;
    r.hetero = site.group != nullptr && (*site.group)[row] == "HETATM";
    r.atom.name = site.text(*site.atom, row, "label_atom_id");
    r.residue_name = site.text(*site.residue, row, "label_comp_id");
    r.chain_id = site.text(*site.chain, row, "auth_asym_id");
    const auto number = site.number->is_null(row) ? std::nullopt : parse_integer((*site.number)[row]);
    if (!number) site.fail(*site.number, row, "auth_seq_id", "an integer");
    r.residue_number = *number;
    r.insertion_code = site.code(site.insertion, row, "pdbx_PDB_ins_code");
    r.altloc = site.code(site.altloc, row, "label_alt_id");
    r.atom.position = {site.decimal(*site.x, row, "Cartn_x"), site.decimal(*site.y, row, "Cartn_y"),
                       site.decimal(*site.z, row, "Cartn_z")};
    if (site.occupancy) r.atom.occupancy = site.decimal(*site.occupancy, row, "occupancy");
    if (site.b_factor) r.atom.b_factor = site.decimal(*site.b_factor, row, "B_iso_or_equiv");
    if (site.element && !site.element->is_null(row)) r.atom.element = std::string((*site.element)[row]);
    r.atom.element = upper_case(r.atom.element);
    const std::string chain_id = r.chain_id;
    const StructureBuilder::Place place = builder.add(std::move(r));
    if (place.chain < 0 || site.label_asym == nullptr || site.label_asym->is_null(row)) continue;
    const std::string asym(((*site.label_asym)[row]));
    auth_chain_of.emplace(asym, chain_id);
    if (site.label_seq != nullptr && !site.label_seq->is_null(row)) {
      placed.emplace(key(asym, seq_id(block, *site.label_seq, row, "_atom_site.label_seq_id")), place);
    }
  }
  structure.num_models = std::max<int>(1, int(models.size()));
  structure.chains = builder.finish();
  KUAFU_CHECK(!structure.chains.empty(), file, ": _atom_site holds no atoms (other than waters)");

  std::vector<Polymer> polymers = polymers_from_scheme(block);
  if (polymers.empty()) polymers = polymers_from_entities(block, site, auth_chain_of);
  for (Polymer& p : polymers) {
    for (size_t c = 0; c < structure.chains.size(); ++c) {
      Chain& chain = structure.chains[c];
      if (chain.id != p.chain || !chain.sequence.empty()) continue;  // a chain's first polymer only
      chain.sequence_to_residue.assign(p.names.size(), -1);
      for (size_t k = 0; k < p.names.size(); ++k) {
        const auto it = placed.find(key(p.asym, p.seq_ids[k]));
        if (it != placed.end() && it->second.chain == int(c)) chain.sequence_to_residue[k] = it->second.residue;
      }
      chain.sequence = std::move(p.names);
    }
  }
  return structure;
}

Structure read_mmcif(const std::string& path) { return parse_mmcif(read_text_file(path), path); }

Structure read_structure(const std::string& path) {
  for (const char* suffix : {".cif", ".cif.gz", ".mmcif", ".mmcif.gz"}) {
    if (text::ends_with(path, suffix)) return read_mmcif(path);
  }
  return read_pdb(path);
}

}  // namespace kuafu::fold

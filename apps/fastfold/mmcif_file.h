// mmCIF files: a small CIF tokenizer (quoted strings, ';' text fields, loops) and the _atom_site loop,
// with the full sequence from _pdbx_poly_seq_scheme or _entity_poly_seq, read into pdb_file.h's Structure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "apps/fastfold/pdb_file.h"

namespace kuafu::fold {

// The values of one tag: one for a plain item, one a row for a column of a loop.
class CifColumn {
 public:
  size_t size() const { return values_.size(); }
  // As written, without quotes or a text field's semicolons; "" for the null values '.' and '?'.
  std::string_view operator[](size_t row) const;
  std::string_view raw(size_t row) const;                          // as written, also '.' and '?'
  bool is_null(size_t row) const { return values_[row].null; }  // '.' (inapplicable) or '?' (unknown), unquoted
  size_t line(size_t row) const { return values_[row].line; }   // where the value starts

 private:
  friend class CifParser;
  struct Value {
    size_t begin = 0;
    uint32_t size = 0;
    uint32_t line = 0;
    bool null = false;
  };
  const std::string* text_ = nullptr;  // the block's text
  std::vector<Value> values_;
};

// The first data block of a CIF file (data_<name>); tags compare without regard to case, as CIF says.
class CifBlock {
 public:
  const std::string& name() const { return name_; }
  const std::string& file() const { return file_; }
  const CifColumn* find(std::string_view tag) const;  // "_atom_site.Cartn_x"; nullptr when absent

 private:
  friend class CifParser;
  std::shared_ptr<const std::string> text_;  // the values point into it; shared so that copies stay valid
  std::string name_, file_;
  std::unordered_map<std::string, CifColumn> columns_;  // lower-case tag -> values
};

// Tokenizes `text` and keeps its first data block (later blocks and save frames are skipped). Errors
// name `file` and the line: an unterminated quote or text field, a tag without a value, a loop whose
// values do not fill its rows, a tag given twice.
CifBlock parse_cif(std::string text, const std::string& file);

// Reads the _atom_site loop by pdb_file.h's rules (first model: the first row's pdbx_PDB_model_num;
// altlocs, MSE, waters, residues as there). Ids, as AlphaFold reads mmCIF (through Biopython):
// the chain is auth_asym_id and the residue number auth_seq_id with pdbx_PDB_ins_code, so that they
// agree with the PDB file of the same entry; residue and atom names are label_comp_id and
// label_atom_id. Each falls back to its label_/auth_ twin when the file lacks it.
// Each chain's full sequence: _pdbx_poly_seq_scheme when present (pdb_strand_id, seq_id, mon_id;
// the first row of a seq_id given twice), else _entity_poly_seq through _struct_asym; a position
// has coordinates when an atom of the first model has its label_asym_id and label_seq_id.
Structure read_mmcif(const std::string& path);
Structure parse_mmcif(std::string text, const std::string& file);

// read_mmcif for names ending in ".cif" or ".cif.gz", else read_pdb.
Structure read_structure(const std::string& path);

}  // namespace kuafu::fold

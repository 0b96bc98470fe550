// Multiple sequence alignments as AlphaFold's data pipeline reads them (alphafold/data/parsers.py):
// FASTA, a3m, a2m and Stockholm into aligned sequences, descriptions and deletion matrices.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kuafu::fold {

struct Msa {
  std::vector<std::string> sequences;     // rows over the query's columns (FASTA: as read); the query first
  std::vector<std::string> descriptions;  // the header after '>' (Stockholm: the name, a space, #=GS DE text)
  // deletion_matrix[i][j]: residues of row i that the alignment deletes (inserts relative to the query)
  // just before its column j, as AlphaFold's deletion_matrix.
  std::vector<std::vector<int>> deletion_matrix;
  // Stockholm's #=GC lines (SS_cons, RF, ...): tag -> text over the same columns as the rows.
  std::map<std::string, std::string> column_annotations;

  size_t size() const { return sequences.size(); }
};

enum class AlignmentFormat { kFasta, kA3m, kA2m, kStockholm };

// Sequence characters are letters, '-' and '.' (gaps) and '*'; anything else, a sequence before the
// first header, a row of another length than the query, a Stockholm file without its header or its
// closing "//" throws kuafu::Error naming `file`, the line and what was expected.
// - FASTA: lines stripped, blank lines skipped, a sequence's lines joined; deletions all 0.
// - a3m: lowercase letters are insertions: removed, each counted as a deletion before the next column;
//   '.' is dropped; every row must then have the query's length.
// - a2m: as a3m, and every row as written (insertions and '.' included) must have the same length.
// - Stockholm: the first alignment (to "//"); a sequence's blocks joined; '-' and '.' are gaps; the
//   columns where the query (first row) has a gap are removed, their residues counted as deletions (as
//   AlphaFold's parse_stockholm, or convert_stockholm_to_a3m then parse_a3m); '.' left in a row is
//   written '-'; #=GS <name> DE lines describe sequences; #=GC lines are kept, #=GF and #=GR skipped.
Msa parse_fasta(std::string_view text, const std::string& file);
Msa parse_a3m(std::string_view text, const std::string& file);
Msa parse_a2m(std::string_view text, const std::string& file);
Msa parse_stockholm(std::string_view text, const std::string& file);
Msa parse_alignment(std::string_view text, AlignmentFormat format, const std::string& file);

// The format by the name's ending (".gz" after it is allowed): .fasta .fa .fas .faa .fna, .a3m, .a2m,
// .sto .sth .stk .stockholm; kuafu::Error for another ending.
AlignmentFormat alignment_format(const std::string& path);

Msa read_alignment(const std::string& path, AlignmentFormat format);
Msa read_alignment(const std::string& path);  // the format by the name

}  // namespace kuafu::fold

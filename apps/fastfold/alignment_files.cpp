#include "apps/fastfold/alignment_files.h"

#include <cctype>

#include "apps/fastfold/text_fields.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::fold {
namespace {

bool is_gap(char c) { return c == '-' || c == '.'; }
bool is_lower(char c) { return c >= 'a' && c <= 'z'; }

// The text line by line, numbered from 1, with '\r' and surrounding whitespace stripped.
class Lines {
 public:
  explicit Lines(std::string_view text) : rest_(text) {}
  bool next(std::string_view& line) {
    if (rest_.empty()) return false;
    const size_t end = rest_.find('\n');
    line = rest_.substr(0, end);
    rest_.remove_prefix(end == std::string_view::npos ? rest_.size() : end + 1);
    ++number_;
    const size_t first = line.find_first_not_of(" \t\r");
    line = first == std::string_view::npos ? std::string_view()
                                           : line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
    return true;
  }
  size_t number() const { return number_; }

 private:
  std::string_view rest_;
  size_t number_ = 0;
};

void check_residues(std::string_view residues, const std::string& file, size_t line) {
  for (size_t k = 0; k < residues.size(); ++k) {
    const char c = residues[k];
    if (!std::isalpha(static_cast<unsigned char>(c)) && !is_gap(c) && c != '*') {
      fail_at_line(file, line, detail::concat("expected residues (letters, '-', '.', '*'), found '", c, "' at character ",
                                              k + 1, " of the sequence"));
    }
  }
}

// FASTA records with the line of each header.
struct Records {
  Msa msa;
  std::vector<size_t> lines;
};

Records read_records(std::string_view text, const std::string& file) {
  Records r;
  Lines lines(text);
  std::string_view line;
  while (lines.next(line)) {
    if (line.empty()) continue;
    if (line[0] == '>') {
      r.msa.descriptions.emplace_back(line.substr(1));
      r.msa.sequences.emplace_back();
      r.lines.push_back(lines.number());
      continue;
    }
    if (r.msa.sequences.empty()) {
      fail_at_line(file, lines.number(), "expected a '>' header before the first sequence line");
    }
    check_residues(line, file, lines.number());
    r.msa.sequences.back() += line;
  }
  KUAFU_CHECK(!r.msa.sequences.empty(), file, ": expected sequences ('>' headers), found none");
  return r;
}

// a3m's reading of each row; a2m first checks that the rows as written line up.
Msa read_a3m(std::string_view text, const std::string& file, bool a2m) {
  Records r = read_records(text, file);
  Msa& msa = r.msa;
  const size_t written = msa.sequences[0].size();
  for (size_t i = 0; i < msa.size(); ++i) {
    const std::string& row = msa.sequences[i];
    if (a2m && row.size() != written) {
      fail_at_line(file, r.lines[i], detail::concat("expected an a2m row of ", written,
                                                    " characters (as the query's), found ", row.size()));
    }
    std::string aligned;
    std::vector<int> deletions;
    int deleted = 0;
    for (char c : row) {
      if (is_lower(c)) {
        ++deleted;
      } else if (c != '.') {
        aligned += c;
        deletions.push_back(deleted);
        deleted = 0;
      }
    }
    if (i > 0 && aligned.size() != msa.sequences[0].size()) {
      fail_at_line(file, r.lines[i], detail::concat("expected ", msa.sequences[0].size(),
                                                    " aligned columns (as the query: uppercase letters and '-'), found ",
                                                    aligned.size()));
    }
    msa.sequences[i] = std::move(aligned);
    msa.deletion_matrix.push_back(std::move(deletions));
  }
  return std::move(msa);
}

}  // namespace

Msa parse_fasta(std::string_view text, const std::string& file) {
  Msa msa = read_records(text, file).msa;
  for (const std::string& s : msa.sequences) msa.deletion_matrix.emplace_back(s.size(), 0);
  return msa;
}

Msa parse_a3m(std::string_view text, const std::string& file) { return read_a3m(text, file, false); }

Msa parse_a2m(std::string_view text, const std::string& file) { return read_a3m(text, file, true); }

Msa parse_stockholm(std::string_view text, const std::string& file) {
  struct Row {
    std::string name, residues;
    size_t line = 0;        // where it starts
    size_t last_line = 0;   // where its latest block's part stands
    size_t last_block = 0;
  };
  std::vector<Row> rows;
  std::map<std::string, size_t> row_of;
  std::map<std::string, std::pair<std::string, size_t>> annotations;  // #=GC tag -> text, first line
  std::map<std::string, std::string> descriptions;
  Lines lines(text);
  std::string_view line;
  bool header = false, closed = false;
  size_t block = 1;  // blocks are separated by blank lines; a name appears once in each
  bool in_block = false;
  while (!closed && lines.next(line)) {
    if (line.empty()) {
      block += in_block;
      in_block = false;
      continue;
    }
    if (!header) {
      if (!text::starts_with(line, "# STOCKHOLM")) {
        fail_at_line(file, lines.number(), detail::concat("expected '# STOCKHOLM 1.0', found '", text::abbreviate(line, 40), "'"));
      }
      header = true;
      continue;
    }
    if (line == "//") {
      closed = true;
    } else if (text::starts_with(line, "#=GS") || text::starts_with(line, "#=GC")) {
      // "#=GS <name> <feature> <text>", "#=GC <tag> <text>"
      std::vector<std::string> words;
      std::string_view rest = line;
      const size_t wanted = line[3] == 'S' ? 3 : 2;
      while (words.size() < wanted) {
        const size_t start = rest.find_first_not_of(" \t");
        if (start == std::string_view::npos) break;
        rest.remove_prefix(start);
        const size_t end = std::min(rest.find_first_of(" \t"), rest.size());
        words.emplace_back(rest.substr(0, end));
        rest.remove_prefix(end);
      }
      const size_t start = rest.find_first_not_of(" \t");
      rest = start == std::string_view::npos ? std::string_view() : rest.substr(start);
      if (words.size() < wanted || (wanted == 2 && rest.empty())) {
        fail_at_line(file, lines.number(), wanted == 3 ? "expected '#=GS <name> <feature> <text>'"
                                                       : "expected '#=GC <tag> <text>'");
      }
      if (wanted == 2) {
        auto& [annotation, first] = annotations[words[1]];
        if (annotation.empty()) first = lines.number();
        annotation += rest;
      } else if (words[2] == "DE") {
        std::string& description = descriptions[words[1]];
        description += (description.empty() ? "" : " ") + std::string(rest);
      }
    } else if (line[0] == '#') {
      continue;  // #=GF, #=GR and comments
    } else {
      const size_t space = line.find_first_of(" \t");
      const size_t start = space == std::string_view::npos ? space : line.find_first_not_of(" \t", space);
      if (start == std::string_view::npos || line.find_first_of(" \t", start) != std::string_view::npos) {
        fail_at_line(file, lines.number(), detail::concat("expected '<name> <aligned sequence>', found '",
                                                          text::abbreviate(line, 60), "'"));
      }
      const std::string name(line.substr(0, space));
      const std::string_view residues = line.substr(start);
      check_residues(residues, file, lines.number());
      const auto [it, added] = row_of.emplace(name, rows.size());
      if (added) rows.push_back({name, "", lines.number(), 0, 0});
      Row& row = rows[it->second];
      if (row.last_block == block) {
        fail_at_line(file, lines.number(), detail::concat("expected each name once in a block, but ", name,
                                                          " is here again (also at line ", row.last_line, ")"));
      }
      row.residues += residues;
      row.last_line = lines.number();
      row.last_block = block;
      in_block = true;
    }
  }
  if (!header) fail_at_line(file, 1, "expected '# STOCKHOLM 1.0', found an empty file");
  if (!closed) {
    fail_at_line(file, lines.number(), "expected '//' to close the alignment, but the file ends here (cut short?)");
  }
  KUAFU_CHECK(!rows.empty(), file, ": the Stockholm alignment holds no sequences");

  const std::string& query = rows[0].residues;
  for (const Row& row : rows) {
    if (row.residues.size() != query.size()) {
      fail_at_line(file, row.line, detail::concat("expected the row of ", row.name, " to be ", query.size(),
                                                  " columns long (as the query's), found ", row.residues.size()));
    }
  }
  Msa msa;
  for (const Row& row : rows) {
    std::string aligned;
    std::vector<int> deletions;
    int deleted = 0;
    for (size_t c = 0; c < query.size(); ++c) {
      const char residue = row.residues[c];
      if (!is_gap(query[c])) {
        aligned += residue == '.' ? '-' : residue;
        deletions.push_back(deleted);
        deleted = 0;
      } else if (!is_gap(residue)) {
        ++deleted;
      }
    }
    msa.sequences.push_back(std::move(aligned));
    msa.deletion_matrix.push_back(std::move(deletions));
    const auto description = descriptions.find(row.name);
    msa.descriptions.push_back(description == descriptions.end() ? row.name : row.name + " " + description->second);
  }
  for (const auto& [tag, entry] : annotations) {
    const auto& [annotation, first] = entry;
    if (annotation.size() != query.size()) {
      fail_at_line(file, first, detail::concat("expected #=GC ", tag, " to be ", query.size(),
                                               " columns long (as the rows), found ", annotation.size()));
    }
    std::string kept;
    for (size_t c = 0; c < query.size(); ++c) {
      if (!is_gap(query[c])) kept += annotation[c];
    }
    msa.column_annotations[tag] = std::move(kept);
  }
  return msa;
}

Msa parse_alignment(std::string_view text, AlignmentFormat format, const std::string& file) {
  switch (format) {
    case AlignmentFormat::kFasta:
      return parse_fasta(text, file);
    case AlignmentFormat::kA3m:
      return parse_a3m(text, file);
    case AlignmentFormat::kA2m:
      return parse_a2m(text, file);
    case AlignmentFormat::kStockholm:
      return parse_stockholm(text, file);
  }
  throw Error(file + ": unknown alignment format");
}

AlignmentFormat alignment_format(const std::string& path) {
  const std::string name = text::ends_with(path, ".gz") ? path.substr(0, path.size() - 3) : path;
  const std::pair<const char*, AlignmentFormat> kEndings[] = {
      {".fasta", AlignmentFormat::kFasta}, {".fa", AlignmentFormat::kFasta},      {".fas", AlignmentFormat::kFasta},
      {".faa", AlignmentFormat::kFasta},   {".fna", AlignmentFormat::kFasta},     {".a3m", AlignmentFormat::kA3m},
      {".a2m", AlignmentFormat::kA2m},     {".sto", AlignmentFormat::kStockholm}, {".sth", AlignmentFormat::kStockholm},
      {".stk", AlignmentFormat::kStockholm}, {".stockholm", AlignmentFormat::kStockholm}};
  for (const auto& [ending, format] : kEndings) {
    if (text::ends_with(name, ending)) return format;
  }
  throw Error(path + ": unknown alignment format (expected a name ending in .fasta, .fa, .fas, .faa, .fna, .a3m, "
                     ".a2m, .sto, .sth, .stk or .stockholm, optionally .gz)");
}

Msa read_alignment(const std::string& path, AlignmentFormat format) {
  return parse_alignment(read_text_file(path), format, path);
}

Msa read_alignment(const std::string& path) { return read_alignment(path, alignment_format(path)); }

}  // namespace kuafu::fold

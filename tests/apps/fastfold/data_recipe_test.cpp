// FastFold's split and MSA stage on 300 chains of ProMod3's structure database (Debian's promod3-data)
// with Debian's mmseqs2: every chain in one split, no cluster across splits, no val or test chain within
// the thresholds of a training chain (checked again by an MMseqs2 search and by a Smith-Waterman of our
// own over every pair), MSAs that parse with the query first and hits from training chains only; the same
// seeds give the same split; chain selection and the split's arithmetic alone; failures (no mmseqs, a
// failing mmseqs, an existing folder) leave nothing behind.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "apps/fastfold/alignment_files.h"
#include "apps/fastfold/data_recipe.h"
#include "apps/fastfold/subprocess.h"
#include "core/util/atomic_file.h"
#include "core/util/seed_mix.h"
#include "core/util/text.h"
#include "tests/support/test_util.h"

namespace kuafu::fold {
namespace {
namespace fs = std::filesystem;
using kuafu::testing::Contains;
using kuafu::testing::expected_error;
using nlohmann::json;

const StructureDb& debian_db() {
  static const StructureDb db = read_structure_db(kDebianStructureDb, StructureDbParts{false, false, false});
  return db;
}

// Random chains of the database are almost never homologs (about 6 pairs at 30% identity among 300), so
// the test takes families: a chain and up to four others that share an 8-residue word with it (words in
// 50 chains or more, low complexity, skipped), families in the order of a seeded hash, to 300 chains.
std::vector<std::string> homolog_rich_subset(size_t count, uint64_t seed) {
  ChainSelection window;
  window.min_length = 40;
  window.max_length = 300;
  const std::vector<ChosenChain> chains = select_chains(debian_db(), window);
  const auto words = [](const std::string& s) {
    std::set<uint64_t> result;
    for (size_t i = 0; i + 8 <= s.size(); ++i) {
      uint64_t word = 0;
      for (size_t k = 0; k < 8; ++k) word = word << 5 | static_cast<uint64_t>(s[i + k] - 'A');
      result.insert(word);
    }
    return result;
  };
  std::unordered_map<uint64_t, std::vector<size_t>> holders;
  for (size_t c = 0; c < chains.size(); ++c) {
    for (uint64_t word : words(chains[c].sequence)) holders[word].push_back(c);
  }
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t c = 0; c < chains.size(); ++c) order.emplace_back(mix_seed(seed, static_cast<int64_t>(c), 0, 0), c);
  std::sort(order.begin(), order.end());
  std::vector<std::string> subset;
  std::set<size_t> taken;
  for (const auto& [draw, c] : order) {
    if (subset.size() >= count) break;
    if (taken.count(c)) continue;
    std::set<size_t> relatives;
    for (uint64_t word : words(chains[c].sequence)) {
      const auto& with = holders[word];
      if (with.size() < 50) relatives.insert(with.begin(), with.end());
    }
    relatives.erase(c);
    for (size_t t : taken) relatives.erase(t);
    if (relatives.empty()) continue;
    std::vector<size_t> family = {c};
    for (size_t r : relatives) {
      if (family.size() == 5) break;
      family.push_back(r);
    }
    for (size_t f : family) {
      if (subset.size() < count) subset.push_back(chains[f].id), taken.insert(f);
    }
  }
  return subset;
}

// What the test suite runs with: ColabFold's and OpenFold3's parameters, less sensitive and a single
// search iteration to stay within seconds on two cores. The clusters' sensitivity is MMseqs2's lowest:
// the split does not depend on it (every pair is aligned), and the clusters it misses are what the
// all-pairs links must join.
DataRecipeOptions test_options(const fs::path& out) {
  DataRecipeOptions options;
  options.out_dir = out.string();
  options.threads = 2;
  options.selection.only = homolog_rich_subset(300, 7);
  options.selection.max_length = 300;
  options.cluster.sensitivity = 1;
  options.msa.num_iterations = 1;
  options.msa.sensitivity = 5.7;
  options.split.seed = 11;
  return options;
}

std::vector<std::map<std::string, std::string>> read_table(const fs::path& file) {
  const std::vector<std::string> lines = text::split(read_file(file.string()), '\n');
  const std::vector<std::string> header = text::split(lines.at(0), '\t');
  std::vector<std::map<std::string, std::string>> rows;
  for (size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].empty()) continue;
    const std::vector<std::string> fields = text::split(lines[i], '\t');
    EXPECT_EQ(fields.size(), header.size()) << file << " line " << i + 1;
    std::map<std::string, std::string> row;
    for (size_t k = 0; k < header.size() && k < fields.size(); ++k) row[header[k]] = fields[k];
    rows.push_back(row);
  }
  return rows;
}

// Only the named folder, and no sibling left by a writer (partial, new or old folders).
void expect_no_leftovers(const fs::path& parent, const std::string& name) {
  for (const auto& entry : fs::directory_iterator(parent)) {
    const std::string found = entry.path().filename().string();
    EXPECT_FALSE(found != name && text::starts_with(found, name + ".")) << "left behind: " << entry.path();
  }
}

// ---- an independent check: Smith-Waterman with BLOSUM62 and MMseqs2's gap costs (11 to open, 1 each
// further residue), identity over the alignment's columns and coverage of each sequence as MMseqs2
// defines them (fident, qcov, tcov), without its composition-bias correction.
constexpr char kAminoAcids[] = "ARNDCQEGHILKMFPSTWYV";
constexpr int kBlosum62[20][20] = {
    {4, -1, -2, -2, 0, -1, -1, 0, -2, -1, -1, -1, -1, -2, -1, 1, 0, -3, -2, 0},
    {-1, 5, 0, -2, -3, 1, 0, -2, 0, -3, -2, 2, -1, -3, -2, -1, -1, -3, -2, -3},
    {-2, 0, 6, 1, -3, 0, 0, 0, 1, -3, -3, 0, -2, -3, -2, 1, 0, -4, -2, -3},
    {-2, -2, 1, 6, -3, 0, 2, -1, -1, -3, -4, -1, -3, -3, -1, 0, -1, -4, -3, -3},
    {0, -3, -3, -3, 9, -3, -4, -3, -3, -1, -1, -3, -1, -2, -3, -1, -1, -2, -2, -1},
    {-1, 1, 0, 0, -3, 5, 2, -2, 0, -3, -2, 1, 0, -3, -1, 0, -1, -2, -1, -2},
    {-1, 0, 0, 2, -4, 2, 5, -2, 0, -3, -3, 1, -2, -3, -1, 0, -1, -3, -2, -2},
    {0, -2, 0, -1, -3, -2, -2, 6, -2, -4, -4, -2, -3, -3, -2, 0, -2, -2, -3, -3},
    {-2, 0, 1, -1, -3, 0, 0, -2, 8, -3, -3, -1, -2, -1, -2, -1, -2, -2, 2, -3},
    {-1, -3, -3, -3, -1, -3, -3, -4, -3, 4, 2, -3, 1, 0, -3, -2, -1, -3, -1, 3},
    {-1, -2, -3, -4, -1, -2, -3, -4, -3, 2, 4, -2, 2, 0, -3, -2, -1, -2, -1, 1},
    {-1, 2, 0, -1, -3, 1, 1, -2, -1, -3, -2, 5, -1, -3, -1, 0, -1, -3, -2, -2},
    {-1, -1, -2, -3, -1, 0, -2, -3, -2, 1, 2, -1, 5, 0, -2, -1, -1, -1, -1, 1},
    {-2, -3, -3, -3, -2, -3, -3, -3, -1, 0, 0, -3, 0, 6, -4, -2, -2, 1, 3, -1},
    {-1, -2, -2, -1, -3, -1, -1, -2, -2, -3, -3, -1, -2, -4, 7, -1, -1, -4, -3, -2},
    {1, -1, 1, 0, -1, 0, 0, 0, -1, -2, -2, 0, -1, -2, -1, 4, 1, -3, -2, -2},
    {0, -1, 0, -1, -1, -1, -1, -2, -2, -1, -1, -1, -1, -2, -1, 1, 5, -2, -2, 0},
    {-3, -3, -4, -4, -2, -2, -3, -2, -2, -3, -2, -3, -1, 1, -4, -3, -2, 11, 2, -3},
    {-2, -2, -2, -3, -2, -1, -2, -3, 2, -1, -1, -2, -1, 3, -3, -2, -2, 2, 7, -1},
    {0, -3, -3, -3, -1, -2, -2, -3, -3, 3, 1, -2, 1, -1, -2, -2, 0, -3, -1, 4}};

std::vector<int> encode(const std::string& s) {
  std::vector<int> codes;
  for (char c : s) {
    const char* at = std::find(kAminoAcids, kAminoAcids + 20, c);
    codes.push_back(at == kAminoAcids + 20 ? 0 : static_cast<int>(at - kAminoAcids));
  }
  return codes;
}

struct LocalAlignment {
  double identity = 0, query_coverage = 0, target_coverage = 0;
};

// Gotoh's local alignment with a traceback from the best cell.
LocalAlignment smith_waterman(const std::vector<int>& q, const std::vector<int>& t) {
  constexpr int kOpen = 11, kExtend = 1, kNone = -1000000;
  const size_t n = q.size(), m = t.size();
  std::vector<int> h((n + 1) * (m + 1), 0), e(h.size(), kNone), f(h.size(), kNone);
  // Per cell: where H came from (0 stop, 1 diagonal, 2 E, 3 F), and whether E / F extend a gap.
  std::vector<uint8_t> from(h.size(), 0), e_extends(h.size(), 0), f_extends(h.size(), 0);
  const auto at = [m](size_t i, size_t j) { return i * (m + 1) + j; };
  int best = 0;
  size_t best_i = 0, best_j = 0;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t c = at(i, j);
      const int e_open = h[at(i, j - 1)] - kOpen, e_ext = e[at(i, j - 1)] - kExtend;
      e[c] = std::max(e_open, e_ext), e_extends[c] = e_ext > e_open;
      const int f_open = h[at(i - 1, j)] - kOpen, f_ext = f[at(i - 1, j)] - kExtend;
      f[c] = std::max(f_open, f_ext), f_extends[c] = f_ext > f_open;
      const int diagonal = h[at(i - 1, j - 1)] + kBlosum62[q[i - 1]][t[j - 1]];
      int value = 0;
      uint8_t source = 0;
      if (diagonal > value) value = diagonal, source = 1;
      if (e[c] > value) value = e[c], source = 2;
      if (f[c] > value) value = f[c], source = 3;
      h[c] = value, from[c] = source;
      if (value > best) best = value, best_i = i, best_j = j;
    }
  }
  size_t i = best_i, j = best_j, columns = 0, identical = 0;
  int state = 0;  // 0: in H, 2: in E (gap in the query), 3: in F (gap in the target)
  while (i > 0 && j > 0) {
    const size_t c = at(i, j);
    if (state == 0) {
      if (from[c] == 0) break;
      if (from[c] == 1) {
        ++columns, identical += q[i - 1] == t[j - 1];
        --i, --j;
        continue;
      }
      state = from[c];
    }
    ++columns;
    if (state == 2) {
      state = e_extends[c] ? 2 : 0;
      --j;
    } else {
      state = f_extends[c] ? 3 : 0;
      --i;
    }
  }
  LocalAlignment result;
  if (columns == 0) return result;
  result.identity = static_cast<double>(identical) / static_cast<double>(columns);
  result.query_coverage = static_cast<double>(best_i - i) / static_cast<double>(n);
  result.target_coverage = static_cast<double>(best_j - j) / static_cast<double>(m);
  return result;
}

TEST(SmithWatermanTest, IdentityAndCoverageOfKnownAlignments) {
  const std::string s = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ";
  const LocalAlignment self = smith_waterman(encode(s), encode(s));
  EXPECT_DOUBLE_EQ(self.identity, 1.0);
  EXPECT_DOUBLE_EQ(self.query_coverage, 1.0);
  const LocalAlignment inside = smith_waterman(encode(s.substr(5, 20)), encode(s));
  EXPECT_DOUBLE_EQ(inside.identity, 1.0);
  EXPECT_DOUBLE_EQ(inside.query_coverage, 1.0);
  EXPECT_DOUBLE_EQ(inside.target_coverage, 20.0 / static_cast<double>(s.size()));
  // Three residues inserted in the middle: one gap of three columns, 33 identical of 36.
  const std::string longer = s.substr(0, 16) + "WWW" + s.substr(16);
  const LocalAlignment gapped = smith_waterman(encode(s), encode(longer));
  EXPECT_NEAR(gapped.identity, 33.0 / 36.0, 1e-12);
  EXPECT_DOUBLE_EQ(gapped.target_coverage, 1.0);
}

// ---- the run, shared by the tests that read its output.
class DataRecipeRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(kuafu::testing::temp_dir("data_recipe"));
    options_ = new DataRecipeOptions(test_options(*root_ / "recipe"));
    summary_ = new DataRecipeSummary(run_data_recipe(*options_));
    std::cout << "[ recipe   ] " << summary_->chains << " chains, " << summary_->clusters << " clusters, "
              << summary_->cross_links << " cross-cluster links, " << summary_->groups << " groups; train/val/test "
              << summary_->split_chains[0] << "/" << summary_->split_chains[1] << "/" << summary_->split_chains[2]
              << " chains, " << summary_->split_clusters[0] << "/" << summary_->split_clusters[1] << "/"
              << summary_->split_clusters[2] << " clusters; MSA rows min " << summary_->msa_min_depth << " median "
              << summary_->msa_median_depth << " mean " << summary_->msa_mean_depth << " max "
              << summary_->msa_max_depth << ", query only " << summary_->msa_query_only << "; seconds: select "
              << summary_->select_seconds << " cluster " << summary_->cluster_seconds << " link "
              << summary_->link_seconds << " msa " << summary_->msa_seconds << " total " << summary_->total_seconds
              << " (" << summary_->mmseqs_version << ")\n";
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete summary_;
    delete options_;
    delete root_;
  }
  static fs::path out() { return *root_ / "recipe"; }

  // chain id -> its chains.tsv row.
  static std::map<std::string, std::map<std::string, std::string>> chains() {
    std::map<std::string, std::map<std::string, std::string>> by_id;
    for (auto& row : read_table(out() / "chains.tsv")) by_id[row["chain_id"]] = row;
    return by_id;
  }

  static fs::path* root_;
  static DataRecipeOptions* options_;
  static DataRecipeSummary* summary_;
};
fs::path* DataRecipeRun::root_ = nullptr;
DataRecipeOptions* DataRecipeRun::options_ = nullptr;
DataRecipeSummary* DataRecipeRun::summary_ = nullptr;

TEST_F(DataRecipeRun, EveryChainIsInExactlyOneSplitAndTheManifestAgrees) {
  const auto by_id = chains();
  EXPECT_EQ(by_id.size(), summary_->chains);
  EXPECT_EQ(summary_->chains, 300u);  // the subset's sequences are distinct and within the lengths
  const json manifest = json::parse(read_file((out() / "manifest.json").string()));
  std::map<std::string, std::string> split_of;
  for (Split split : kSplits) {
    size_t count = 0;
    for (const json& chain : manifest["splits"][split_name(split)]) {
      const std::string id = chain["id"];
      EXPECT_TRUE(split_of.emplace(id, split_name(split)).second) << id << " is in two splits";
      ASSERT_TRUE(by_id.count(id)) << id;
      EXPECT_EQ(by_id.at(id).at("split"), split_name(split)) << id;
      EXPECT_EQ(std::to_string(chain["db_index"].get<size_t>()), by_id.at(id).at("db_index")) << id;
      ++count;
    }
    EXPECT_EQ(count, summary_->split_chains[static_cast<size_t>(split)]) << split_name(split);
    EXPECT_GT(count, 0u) << split_name(split);
  }
  EXPECT_EQ(split_of.size(), by_id.size());
  // Close to 80/10/10 (a group goes whole).
  EXPECT_NEAR(static_cast<double>(summary_->split_chains[0]), 240, 6);
  EXPECT_NEAR(static_cast<double>(summary_->split_chains[1]), 30, 6);
  // The chain's database index, length and sequence are the database's.
  const Msa sequences = parse_fasta(read_file((out() / "sequences.fasta").string()), "sequences.fasta");
  ASSERT_EQ(sequences.size(), by_id.size());
  std::set<std::string> distinct(sequences.sequences.begin(), sequences.sequences.end());
  EXPECT_EQ(distinct.size(), sequences.size()) << "identical sequences were chosen twice";
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& row = by_id.at(sequences.descriptions[i]);
    const StructureChain chain = debian_db().chain(std::stoul(row.at("db_index")));
    EXPECT_EQ(chain.pdb_id + "_" + chain.chain_name, sequences.descriptions[i]);
    EXPECT_EQ(chain.sequence, sequences.sequences[i]);
    EXPECT_EQ(row.at("length"), std::to_string(chain.sequence.size()));
  }
}

TEST_F(DataRecipeRun, NoClusterOrGroupIsInTwoSplits) {
  const auto by_id = chains();
  std::map<std::string, std::set<std::string>> splits_of_cluster, splits_of_group;
  for (const auto& [id, row] : by_id) {
    splits_of_cluster[row.at("cluster")].insert(row.at("split"));
    splits_of_group[row.at("group")].insert(row.at("split"));
  }
  for (const auto& [cluster, splits] : splits_of_cluster) EXPECT_EQ(splits.size(), 1u) << "cluster " << cluster;
  for (const auto& [group, splits] : splits_of_group) EXPECT_EQ(splits.size(), 1u) << "group " << group;
  EXPECT_EQ(splits_of_cluster.size(), summary_->clusters);
  EXPECT_EQ(splits_of_group.size(), summary_->groups);
  // clusters.tsv is MMseqs2's and agrees; the subset holds real families.
  std::set<std::string> members;
  for (const std::string& line : text::split(read_file((out() / "clusters.tsv").string()), '\n')) {
    if (line.empty()) continue;
    const auto fields = text::split(line, '\t');
    ASSERT_EQ(fields.size(), 2u);
    EXPECT_EQ(by_id.at(fields[1]).at("cluster"), fields[0]);
    EXPECT_TRUE(members.insert(fields[1]).second) << fields[1] << " is in two clusters";
  }
  EXPECT_EQ(members.size(), by_id.size());
  EXPECT_LT(summary_->clusters, summary_->chains * 9 / 10);
  EXPECT_GT(summary_->cross_links, 0u);
  EXPECT_LT(summary_->groups, summary_->clusters);
  // links.tsv: each link joins chains of different clusters in one group.
  for (auto& link : read_table(out() / "links.tsv")) {
    const auto& a = by_id.at(link["query"]);
    const auto& b = by_id.at(link["target"]);
    EXPECT_NE(a.at("cluster"), b.at("cluster"));
    EXPECT_EQ(a.at("group"), b.at("group"));
    EXPECT_GE(std::stod(link["identity"]), options_->cluster.min_seq_id);
  }
}

// The split's promise, checked twice without the recipe's own alignments: MMseqs2's k-mer search (not the
// all-pairs path the recipe takes) of val and test against train, with no thresholds given to it, and our
// own Smith-Waterman of every val or test chain against every training chain.
TEST_F(DataRecipeRun, NoValOrTestChainIsWithinTheThresholdsOfATrainingChain) {
  const auto by_id = chains();
  const Msa sequences = parse_fasta(read_file((out() / "sequences.fasta").string()), "sequences.fasta");
  std::string train_fasta, held_out_fasta;
  std::vector<std::vector<int>> train, held_out;
  std::vector<std::string> held_out_ids;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const std::string entry = ">" + sequences.descriptions[i] + "\n" + sequences.sequences[i] + "\n";
    if (by_id.at(sequences.descriptions[i]).at("split") == "train") {
      train_fasta += entry;
      train.push_back(encode(sequences.sequences[i]));
    } else {
      held_out_fasta += entry;
      held_out.push_back(encode(sequences.sequences[i]));
      held_out_ids.push_back(sequences.descriptions[i]);
    }
  }
  const fs::path work = *root_ / "check";
  fs::create_directories(work);
  {
    std::ofstream(work / "train.fasta") << train_fasta;
    std::ofstream(work / "held_out.fasta") << held_out_fasta;
  }
  run_program({"mmseqs", "easy-search", (work / "held_out.fasta").string(), (work / "train.fasta").string(),
               (work / "hits.tsv").string(), (work / "tmp").string(), "-s", "7.5", "-e", "inf", "--max-seqs", "1000",
               "--format-output", "query,target,fident,qcov,tcov", "--threads", "2", "-v", "1"});
  const double identity = options_->cluster.min_seq_id, coverage = options_->cluster.coverage;
  size_t hits = 0;
  double closest = 0;
  for (const std::string& line : text::split(read_file((work / "hits.tsv").string()), '\n')) {
    if (line.empty()) continue;
    const auto f = text::split(line, '\t');
    ASSERT_EQ(f.size(), 5u) << line;
    ++hits;
    const bool covered = std::stod(f[3]) >= coverage && std::stod(f[4]) >= coverage;
    if (covered) closest = std::max(closest, std::stod(f[2]));
    EXPECT_FALSE(covered && std::stod(f[2]) >= identity) << "MMseqs2 search: " << line;
  }
  size_t pairs = 0, covered_pairs = 0;
  double closest_own = 0;
  for (size_t h = 0; h < held_out.size(); ++h) {
    for (size_t t = 0; t < train.size(); ++t) {
      const LocalAlignment a = smith_waterman(held_out[h], train[t]);
      ++pairs;
      if (a.query_coverage < coverage || a.target_coverage < coverage) continue;
      ++covered_pairs;
      closest_own = std::max(closest_own, a.identity);
      EXPECT_LT(a.identity, identity) << held_out_ids[h] << " vs training chain " << t << ": identity "
                                      << a.identity << " over " << a.query_coverage << " / " << a.target_coverage;
    }
  }
  std::cout << "[ check    ] MMseqs2 search: " << hits << " hits, highest identity at both coverages >= "
            << coverage << ": " << closest << "; Smith-Waterman: " << pairs << " pairs, " << covered_pairs
            << " at both coverages, highest identity among them " << closest_own << "\n";
}

TEST_F(DataRecipeRun, MsasParseWithTheQueryFirstAndHitsFromTrainingChainsOnly) {
  const auto by_id = chains();
  const Msa sequences = parse_fasta(read_file((out() / "sequences.fasta").string()), "sequences.fasta");
  size_t files = 0, held_out_with_hits = 0, rows_with_insertions = 0, hits = 0;
  for (const auto& entry : fs::directory_iterator(out() / "msas")) {
    ++files;
    EXPECT_EQ(entry.path().extension(), ".a3m");
    EXPECT_TRUE(by_id.count(entry.path().stem().string())) << entry.path();
  }
  EXPECT_EQ(files, by_id.size());
  for (size_t i = 0; i < sequences.size(); ++i) {
    const std::string& id = sequences.descriptions[i];
    const fs::path file = out() / "msas" / (id + ".a3m");
    const Msa msa = read_alignment(file.string(), AlignmentFormat::kA3m);  // every row has the query's length
    ASSERT_GE(msa.size(), 1u) << file;
    EXPECT_EQ(msa.descriptions[0], id);
    EXPECT_EQ(msa.sequences[0], sequences.sequences[i]) << file;
    const bool held_out = by_id.at(id).at("split") != "train";
    held_out_with_hits += held_out && msa.size() > 1;
    for (size_t r = 1; r < msa.size(); ++r) {
      ++hits;
      EXPECT_EQ(msa.sequences[r].size(), sequences.sequences[i].size());
      const std::string hit = text::split(msa.descriptions[r], '\t')[0];
      ASSERT_TRUE(by_id.count(hit)) << file << ": " << hit;
      EXPECT_EQ(by_id.at(hit).at("split"), "train") << file << ": hit " << hit;
      EXPECT_NE(hit, id) << file << ": the query's own row";
      const auto& deletions = msa.deletion_matrix[r];
      rows_with_insertions += std::any_of(deletions.begin(), deletions.end(), [](int d) { return d > 0; });
      if (held_out) {
        EXPECT_NE(by_id.at(hit).at("group"), by_id.at(id).at("group")) << file << ": " << hit;
      }
    }
  }
  std::cout << "[ msas     ] " << files << " files, " << hits << " hit rows (" << rows_with_insertions
            << " with insertions), " << held_out_with_hits << " val/test chains with hits\n";
  EXPECT_GT(hits, 100u);
  EXPECT_GT(rows_with_insertions, 0u);
  EXPECT_GT(held_out_with_hits, 0u);
  EXPECT_EQ(summary_->msa_max_depth > 1, true);
}

// Run again with the same seeds into a folder that already holds something, asking for overwrite (and
// without MSAs): the same clusters and split, and the old folder's contents gone.
TEST_F(DataRecipeRun, TheSameSeedsGiveTheSameSplitAndOverwriteReplacesTheFolderWhole) {
  DataRecipeOptions again = *options_;
  again.out_dir = (*root_ / "again").string();
  again.msa.build = false;
  again.overwrite = true;
  fs::create_directories(again.out_dir);
  std::ofstream(fs::path(again.out_dir) / "old.txt") << "from an earlier run\n";
  const DataRecipeSummary summary = run_data_recipe(again);
  EXPECT_EQ(read_file((fs::path(again.out_dir) / "chains.tsv").string()), read_file((out() / "chains.tsv").string()));
  for (const char* file : {"clusters.tsv", "links.tsv", "sequences.fasta"}) {
    EXPECT_EQ(read_file((fs::path(again.out_dir) / file).string()), read_file((out() / file).string())) << file;
  }
  EXPECT_EQ(summary.split_chains, summary_->split_chains);
  EXPECT_FALSE(fs::exists(fs::path(again.out_dir) / "old.txt"));
  EXPECT_FALSE(fs::exists(fs::path(again.out_dir) / "msas"));
  EXPECT_FALSE(fs::exists(fs::path(again.out_dir) / "work"));
  expect_no_leftovers(*root_, "again");
  expect_no_leftovers(*root_, "recipe");
}

// ---- failures, before any mmseqs work and during it.
class DataRecipeFailureTest : public kuafu::testing::TempDirTest {
 protected:
  DataRecipeFailureTest() : TempDirTest("data_recipe_failure_") {}
  DataRecipeOptions small(const std::string& name) {
    DataRecipeOptions options;
    options.out_dir = path(name);
    options.threads = 2;
    options.selection.max_chains = 20;
    options.msa.build = false;
    return options;
  }
};

// $PATH emptied for as long as it lives, however the test ends.
struct EmptyPath {
  std::string saved = std::getenv("PATH") ? std::getenv("PATH") : "";
  EmptyPath() { ::setenv("PATH", "", 1); }
  ~EmptyPath() { ::setenv("PATH", saved.c_str(), 1); }
};

TEST_F(DataRecipeFailureTest, AMissingMmseqsIsNamedAndNothingIsWritten) {
  std::string message;
  {
    EmptyPath empty;
    message = expected_error([&] { run_data_recipe(small("out")); });
  }
  EXPECT_TRUE(Contains(message, "mmseqs not found"));
  EXPECT_TRUE(Contains(message, "PATH="));
  EXPECT_TRUE(Contains(message, "mmseqs2"));
  EXPECT_FALSE(fs::exists(path("out")));
  expect_no_leftovers(dir_, "out");
  // A path that is not there either.
  DataRecipeOptions options = small("out");
  options.mmseqs = path("no/such/mmseqs");
  EXPECT_TRUE(Contains(expected_error([&] { run_data_recipe(options); }), "no/such/mmseqs not found"));
}

TEST_F(DataRecipeFailureTest, AnExistingFolderIsNotOverwritten) {
  fs::create_directories(path("out"));
  std::ofstream(path("out/keep.txt")) << "keep me\n";
  const std::string message = expected_error([&] { run_data_recipe(small("out")); });
  EXPECT_TRUE(Contains(message, "already exists"));
  EXPECT_EQ(read_file(path("out/keep.txt")), "keep me\n");
  expect_no_leftovers(dir_, "out");
}

// mmseqs that answers `version` and then fails the clustering: the error shows the command and what the
// program printed last; the half-built folder is gone.
TEST_F(DataRecipeFailureTest, AFailingMmseqsShowsItsCommandAndLastLinesAndLeavesNothing) {
  const std::string fake = path("mmseqs");
  std::ofstream(fake) << "#!/bin/sh\n"
                         "if [ \"$1\" = version ]; then echo 14-fake; exit 0; fi\n"
                         "echo \"starting $1\"\n"
                         "echo 'Input database sequences.fasta has the wrong type' >&2\n"
                         "exit 3\n";
  fs::permissions(fake, fs::perms::owner_all);
  DataRecipeOptions options = small("out");
  options.mmseqs = fake;
  const std::string message = expected_error([&] { run_data_recipe(options); });
  EXPECT_TRUE(Contains(message, "easy-cluster"));
  EXPECT_TRUE(Contains(message, "--min-seq-id 0.3 -c 0.8 --cov-mode 0"));
  EXPECT_TRUE(Contains(message, "exit status 3"));
  EXPECT_TRUE(Contains(message, "has the wrong type"));
  EXPECT_FALSE(fs::exists(path("out")));
  expect_no_leftovers(dir_, "out");
}

TEST_F(DataRecipeFailureTest, OptionsAreCheckedBeforeAnyWork) {
  DataRecipeOptions options = small("out");
  options.split.val = 0.3;
  EXPECT_TRUE(Contains(expected_error([&] { run_data_recipe(options); }), "sum to 1"));
  options = small("out");
  options.cluster.min_seq_id = 30;
  EXPECT_TRUE(Contains(expected_error([&] { run_data_recipe(options); }), "cluster.min_seq_id"));
  options = small("out");
  options.selection.only = {"12AS_A", "NOPE_Z"};
  EXPECT_TRUE(Contains(expected_error([&] { run_data_recipe(options); }), "NOPE_Z"));
  EXPECT_FALSE(fs::exists(path("out")));
}

// ---- the subprocess helper.
TEST(RunProgramTest, CapturesOutputAndReportsFailuresWithTheirLastLines) {
  EXPECT_EQ(run_program({"sh", "-c", "echo out; echo err >&2"}), "out\nerr\n");
  std::string script = "for i in $(seq 1 100); do echo line $i; done; exit 7";
  const std::string message = expected_error([&] { run_program({"sh", "-c", script}); });
  EXPECT_TRUE(Contains(message, "sh -c 'for i in"));
  EXPECT_TRUE(Contains(message, "exit status 7"));
  EXPECT_TRUE(Contains(message, "line 100"));
  EXPECT_TRUE(Contains(message, "line 81"));
  EXPECT_FALSE(message.find("line 80\n") != std::string::npos) << message;  // the last 20 lines only
  EXPECT_TRUE(Contains(expected_error([&] { run_program({"sh", "-c", "kill -9 $$"}); }), "killed by signal 9"));
  EXPECT_TRUE(Contains(expected_error([&] { run_program({"kuafu-no-such-program", "x"}); }),
                       "kuafu-no-such-program not found"));
  EXPECT_EQ(find_program("kuafu-no-such-program"), "");
  EXPECT_NE(find_program("sh"), "");
}

// ---- chain selection and the split's arithmetic, without mmseqs.
TEST(SelectChainsTest, LengthsDistinctSequencesFirstInDatabaseOrderAndASeededCap) {
  ChainSelection selection;
  selection.min_length = 50;
  selection.max_length = 200;
  const std::vector<ChosenChain> chosen = select_chains(debian_db(), selection);
  std::unordered_map<std::string, size_t> first_with;  // sequence -> first chain in the window
  size_t in_window = 0;
  for (size_t i = 0; i < debian_db().num_chains(); ++i) {
    const ChainRecord& r = debian_db().records()[i];
    if (r.size < 50 || r.size > 200) continue;
    ++in_window;
    first_with.emplace(debian_db().chain(i).sequence, i);
  }
  ASSERT_EQ(chosen.size(), first_with.size());
  EXPECT_LT(chosen.size(), in_window);  // the database holds identical sequences in this window
  for (size_t k = 0; k < chosen.size(); ++k) {
    EXPECT_EQ(first_with.at(chosen[k].sequence), chosen[k].db_index);
    EXPECT_GE(chosen[k].sequence.size(), 50u);
    EXPECT_LE(chosen[k].sequence.size(), 200u);
    if (k > 0) {
      EXPECT_LT(chosen[k - 1].db_index, chosen[k].db_index);
    }
  }
  std::cout << "[ select   ] 50-200 residues: " << in_window << " chains, " << chosen.size()
            << " distinct sequences\n";

  selection.max_chains = 500;
  selection.seed = 1;
  const std::vector<ChosenChain> capped = select_chains(debian_db(), selection);
  ASSERT_EQ(capped.size(), 500u);
  std::set<size_t> all_indices, capped_indices;
  for (const auto& c : chosen) all_indices.insert(c.db_index);
  for (const auto& c : capped) {
    EXPECT_TRUE(all_indices.count(c.db_index));
    capped_indices.insert(c.db_index);
  }
  EXPECT_EQ(capped_indices.size(), 500u);
  std::vector<size_t> again;
  for (const auto& c : select_chains(debian_db(), selection)) again.push_back(c.db_index);
  EXPECT_EQ(again, std::vector<size_t>(capped_indices.begin(), capped_indices.end()));
  selection.seed = 2;
  size_t shared = 0;
  for (const auto& c : select_chains(debian_db(), selection)) shared += capped_indices.count(c.db_index);
  EXPECT_LT(shared, 100u);  // two draws of 500 of about 10,000 share about 25

  selection.only = {"12AS_A", "16PK_A"};
  selection.max_chains = 0;
  selection.max_length = 1000;
  const auto named = select_chains(debian_db(), selection);
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].id, "12AS_A");
  EXPECT_EQ(named[0].db_index, 0u);
}

TEST(AssignSplitsTest, GroupsStayWholeSizesFollowTheFractionsAndTheSeedDecides) {
  // 1,000 chains in groups of 1 to 9.
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> keys;
  for (size_t g = 0, next = 0; next < 1000; ++g) {
    std::vector<size_t> group;
    for (size_t k = 0; k < 1 + g % 9 && next < 1000; ++k) group.push_back(next), keys.push_back(10 * next++);
    groups.push_back(group);
  }
  SplitOptions options;
  const std::vector<Split> split = assign_splits(groups, keys, options);
  std::array<size_t, 3> sizes{};
  for (const auto& group : groups) {
    for (size_t chain : group) EXPECT_EQ(split[chain], split[group[0]]);
  }
  for (Split s : split) ++sizes[static_cast<size_t>(s)];
  EXPECT_NEAR(static_cast<double>(sizes[0]), 800, 9);
  EXPECT_NEAR(static_cast<double>(sizes[1]), 100, 9);
  EXPECT_NEAR(static_cast<double>(sizes[2]), 100, 9);
  EXPECT_EQ(assign_splits(groups, keys, options), split);
  options.seed = 5;
  EXPECT_NE(assign_splits(groups, keys, options), split);
  // A group's draw depends on its keys, not on its position: listed in reverse, the same split.
  std::vector<std::vector<size_t>> reversed(groups.rbegin(), groups.rend());
  options.seed = 0;
  EXPECT_EQ(assign_splits(reversed, keys, options), split);
  // No test set.
  options.val = 0.2;
  options.test = 0;
  for (Split s : assign_splits(groups, keys, options)) EXPECT_NE(s, Split::kTest);
  // Bad input.
  options.val = 0.1;
  EXPECT_TRUE(Contains(expected_error([&] { assign_splits(groups, keys, options); }), "sum to 1"));
  options.test = 0.1;
  EXPECT_TRUE(Contains(expected_error([&] { assign_splits({{0, 1}, {1}}, {0, 1}, options); }), "in two groups"));
  EXPECT_TRUE(Contains(expected_error([&] { assign_splits({{0}}, {0, 1}, options); }), "in no group"));
}

}  // namespace
}  // namespace kuafu::fold

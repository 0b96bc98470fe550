#include "apps/fastfold/data_recipe.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "apps/fastfold/alignment_files.h"
#include "apps/fastfold/subprocess.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/logging.h"
#include "core/util/seed_mix.h"
#include "core/util/text.h"

namespace kuafu::fold {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// mix_seed's last argument: one random stream per use of a seed.
constexpr int64_t kSubsetStream = 1;
constexpr int64_t kSplitStream = 2;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

class UnionFind {
 public:
  explicit UnionFind(size_t n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), size_t{0}); }
  size_t find(size_t x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void join(size_t a, size_t b) {
    a = find(a), b = find(b);
    if (a != b) parent_[std::max(a, b)] = std::min(a, b);  // the root stays the smallest index
  }

 private:
  std::vector<size_t> parent_;
};

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  KUAFU_CHECK(out.good(), "cannot write ", path.string(), ": ", std::strerror(errno));
}

std::string fasta(const std::vector<ChosenChain>& chains, const std::vector<size_t>& which) {
  std::string text;
  for (size_t i : which) text += ">" + chains[i].id + "\n" + chains[i].sequence + "\n";
  return text;
}

// The lines of a tab-separated file MMseqs2 wrote, each split into its fields.
std::vector<std::vector<std::string>> read_tsv(const fs::path& path, size_t fields) {
  std::vector<std::vector<std::string>> rows;
  size_t line_number = 0;
  for (const std::string& line : text::split(read_file(path.string()), '\n')) {
    ++line_number;
    if (line.empty()) continue;
    rows.push_back(text::split(line, '\t'));
    KUAFU_CHECK(rows.back().size() >= fields, path.string(), ":", line_number, ": expected ", fields,
                " tab-separated fields, found ", rows.back().size(), " in '", text::abbreviate(line), "'");
  }
  return rows;
}

void check_options(const DataRecipeOptions& o) {
  KUAFU_CHECK(!o.out_dir.empty(), "data recipe: out_dir is empty; name the folder to write");
  const ClusterOptions& c = o.cluster;
  KUAFU_CHECK(c.min_seq_id > 0 && c.min_seq_id <= 1, "data recipe: cluster.min_seq_id must lie in (0, 1], found ",
              c.min_seq_id);
  KUAFU_CHECK(c.coverage >= 0 && c.coverage <= 1, "data recipe: cluster.coverage must lie in [0, 1], found ",
              c.coverage);
  KUAFU_CHECK(c.cov_mode >= 0 && c.cov_mode <= 5, "data recipe: cluster.cov_mode must be 0 to 5 (MMseqs2's "
              "--cov-mode), found ", c.cov_mode);
  KUAFU_CHECK(c.cluster_mode >= 0 && c.cluster_mode <= 3, "data recipe: cluster.cluster_mode must be 0 to 3, found ",
              c.cluster_mode);
  KUAFU_CHECK(c.sensitivity > 0, "data recipe: cluster.sensitivity must be positive, found ", c.sensitivity);
  const MsaOptions& m = o.msa;
  KUAFU_CHECK(m.num_iterations >= 1, "data recipe: msa.num_iterations must be at least 1, found ", m.num_iterations);
  KUAFU_CHECK(m.sensitivity > 0, "data recipe: msa.sensitivity must be positive, found ", m.sensitivity);
  KUAFU_CHECK(m.evalue > 0, "data recipe: msa.evalue must be positive, found ", m.evalue);
  KUAFU_CHECK(m.max_seqs >= 1, "data recipe: msa.max_seqs must be at least 1");
  KUAFU_CHECK(o.threads >= 0, "data recipe: threads must be 0 (every core) or more, found ", o.threads);
  assign_splits({}, {}, o.split);  // checks the fractions
  const ChainSelection& s = o.selection;
  KUAFU_CHECK(s.min_length >= 1 && s.min_length <= s.max_length, "data recipe: selection needs 1 <= min_length <= "
              "max_length, found min_length ", s.min_length, " and max_length ", s.max_length);
}

// Runs mmseqs modules and keeps their command lines for the manifest (the build folder written as
// "<out>", so that the manifest does not name a temporary folder).
class Mmseqs {
 public:
  Mmseqs(std::string program, int threads) : program_(std::move(program)), threads_(std::to_string(threads)) {}
  void set_folder(const fs::path& folder) { folder_ = folder.string(); }
  std::string run(std::vector<std::string> args, bool threaded = true) {
    args.insert(args.begin(), program_);
    if (threaded) args.insert(args.end(), {"--threads", threads_});
    args.insert(args.end(), {"-v", "1"});
    std::vector<std::string> shown = args;
    shown[0] = "mmseqs";
    for (std::string& arg : shown) {
      if (!folder_.empty() && text::starts_with(arg, folder_)) arg = "<out>" + arg.substr(folder_.size());
    }
    commands_.push_back(command_line(shown));
    return run_program(args);
  }
  const std::vector<std::string>& commands() const { return commands_; }

 private:
  std::string program_, threads_, folder_;
  std::vector<std::string> commands_;
};

// The chain a name MMseqs2 prints stands for.
size_t chain_at(const std::unordered_map<std::string, size_t>& by_id, const std::string& id, const fs::path& file) {
  const auto it = by_id.find(id);
  KUAFU_CHECK(it != by_id.end(), file.string(), ": names '", text::abbreviate(id), "', which is no chosen chain");
  return it->second;
}

// A training chain's search finds the chain itself: its row says nothing the query does not, so it goes.
// Returns the a3m text and its number of rows.
std::pair<std::string, size_t> drop_own_row(const std::string& a3m, const std::string& id) {
  std::string kept;
  size_t rows = 0;
  bool keep = true;
  for (const std::string& line : text::split(a3m, '\n')) {
    if (line.empty()) continue;
    if (line[0] == '>') {
      const std::string name = line.substr(1, line.find_first_of(" \t") - 1);
      keep = rows == 0 || name != id;
      rows += keep;
    }
    if (keep) kept += line + "\n";
  }
  return {kept, rows};
}

// Replaces an existing folder by a new one only once the new one is complete: built beside it, then the
// two swapped in one step (renameat2's RENAME_EXCHANGE; where the file system has none, two renames).
void replace_folder(const fs::path& out, const std::function<void(const fs::path&)>& fill) {
  const fs::path fresh = out.string() + ".new-" + std::to_string(::getpid());
  write_folder_atomic(fresh.string(), fill);
  if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_path(out.parent_path().string());
    fs::remove_all(fresh);  // the old folder, now under the new one's temporary name
    return;
  }
  const fs::path old = out.string() + ".old-" + std::to_string(::getpid());
  rename_durable(out.string(), old.string());
  rename_durable(fresh.string(), out.string());
  fs::remove_all(old);
}

// What one run works out, shared by the stages.
struct Run {
  const DataRecipeOptions& options;
  std::vector<ChosenChain> chains;
  std::unordered_map<std::string, size_t> by_id;
  std::vector<size_t> cluster_of;  // each chain's representative (an index into chains)
  std::vector<size_t> group_of;    // each chain's group: its first chain
  // Pairs of chains of different clusters at the thresholds: (first, second) -> identity, coverages.
  std::map<std::pair<size_t, size_t>, std::array<std::string, 3>> links;
  std::vector<Split> split_of;
  std::vector<size_t> msa_depth;
  DataRecipeSummary summary;
};

void cluster_chains(Run& run, Mmseqs& mmseqs, const fs::path& sequences, const fs::path& work) {
  const auto start = Clock::now();
  const ClusterOptions& c = run.options.cluster;
  mmseqs.run({"easy-cluster", sequences.string(), (work / "clu").string(), (work / "tmp").string(), "--min-seq-id",
              number(c.min_seq_id), "-c", number(c.coverage), "--cov-mode", std::to_string(c.cov_mode),
              "--seq-id-mode", "0", "--cluster-mode", std::to_string(c.cluster_mode), "-s", number(c.sensitivity)});
  const fs::path file = work / "clu_cluster.tsv";
  run.cluster_of.assign(run.chains.size(), SIZE_MAX);
  for (const auto& row : read_tsv(file, 2)) {
    const size_t member = chain_at(run.by_id, row[1], file);
    KUAFU_CHECK(run.cluster_of[member] == SIZE_MAX, file.string(), ": ", row[1], " is in two clusters");
    run.cluster_of[member] = chain_at(run.by_id, row[0], file);
  }
  for (size_t i = 0; i < run.chains.size(); ++i) {
    KUAFU_CHECK(run.cluster_of[i] != SIZE_MAX, file.string(), ": ", run.chains[i].id, " is in no cluster");
  }
  run.summary.cluster_seconds = seconds_since(start);
}

// Every pair of chains the coverage allows, aligned; the clusters a pair at the thresholds joins become
// one group.
void link_clusters(Run& run, Mmseqs& mmseqs, const fs::path& all, const fs::path& work) {
  const auto start = Clock::now();
  const ClusterOptions& c = run.options.cluster;
  const std::string pairs = (work / "pairs").string(), aligned = (work / "aligned").string();
  mmseqs.run({"ungappedprefilter", all.string(), all.string(), pairs, "-c", number(c.coverage), "--cov-mode",
              std::to_string(c.cov_mode), "-e", "inf", "--min-ungapped-score", "0", "--max-seqs",
              std::to_string(run.chains.size())});
  mmseqs.run({"align", all.string(), all.string(), pairs, aligned, "--alignment-mode", "3", "-e", "inf",
              "--min-seq-id", number(c.min_seq_id), "--seq-id-mode", "0", "-c", number(c.coverage), "--cov-mode",
              std::to_string(c.cov_mode)});
  const fs::path file = work / "aligned.tsv";
  mmseqs.run({"convertalis", all.string(), all.string(), aligned, file.string(), "--format-output",
              "query,target,fident,qcov,tcov"});
  UnionFind groups(run.chains.size());
  for (size_t i = 0; i < run.chains.size(); ++i) groups.join(i, run.cluster_of[i]);
  for (const auto& row : read_tsv(file, 5)) {
    const size_t a = chain_at(run.by_id, row[0], file), b = chain_at(run.by_id, row[1], file);
    if (run.cluster_of[a] == run.cluster_of[b]) continue;
    // Each pair once, as the first chain's row has it (the rows come in no fixed order).
    const bool forward = a < b;
    auto& link = run.links[{std::min(a, b), std::max(a, b)}];
    if (link[0].empty() || forward) link = {row[2], forward ? row[3] : row[4], forward ? row[4] : row[3]};
    groups.join(a, b);
  }
  run.group_of.resize(run.chains.size());
  for (size_t i = 0; i < run.chains.size(); ++i) run.group_of[i] = groups.find(i);
  run.summary.link_seconds = seconds_since(start);
}

void split_groups(Run& run) {
  std::map<size_t, std::vector<size_t>> members;
  for (size_t i = 0; i < run.chains.size(); ++i) members[run.group_of[i]].push_back(i);
  std::vector<std::vector<size_t>> groups;
  for (auto& [first, chains] : members) groups.push_back(std::move(chains));
  std::vector<size_t> keys;
  for (const ChosenChain& chain : run.chains) keys.push_back(chain.db_index);
  run.split_of = assign_splits(groups, keys, run.options.split);
}

void build_msas(Run& run, Mmseqs& mmseqs, const fs::path& all, const fs::path& work, const fs::path& out) {
  const auto start = Clock::now();
  const MsaOptions& m = run.options.msa;
  std::vector<size_t> training;
  for (size_t i = 0; i < run.chains.size(); ++i) {
    if (run.split_of[i] == Split::kTrain) training.push_back(i);
  }
  const fs::path train_fasta = work / "train.fasta";
  write_text(train_fasta, fasta(run.chains, training));
  const std::string train = (work / "train").string(), hits = (work / "hits").string(), msa = (work / "msa").string();
  mmseqs.run({"createdb", train_fasta.string(), train}, false);
  // ColabFold's colabfold_search: the search, then result2msa with its filters (expandaln is for its
  // clustered databases and does not apply to a plain set of sequences).
  mmseqs.run({"search", all.string(), train, hits, (work / "tmp").string(), "--num-iterations",
              std::to_string(m.num_iterations), "-a", "-e", number(m.evalue), "--max-seqs", std::to_string(m.max_seqs),
              "-s", number(m.sensitivity)});
  mmseqs.run({"result2msa", all.string(), train, hits, msa, "--msa-format-mode", "6", "--filter-msa", "1",
              "--filter-min-enable", "1000", "--diff", "3000", "--qid", "0.0,0.2,0.4,0.6,0.8,1.0", "--qsc", "0",
              "--max-seq-id", "0.95"});
  const fs::path unpacked = work / "msa_files";
  fs::create_directories(unpacked);
  mmseqs.run({"unpackdb", msa, unpacked.string(), "--unpack-name-mode", "0", "--unpack-suffix", ".a3m"});

  // The query database's keys name the unpacked files.
  const fs::path lookup = all.string() + ".lookup";
  std::vector<std::string> key_of(run.chains.size());
  for (const auto& row : read_tsv(lookup, 2)) key_of[chain_at(run.by_id, row[1], lookup)] = row[0];
  fs::create_directories(out / "msas");
  run.msa_depth.resize(run.chains.size());
  for (size_t i = 0; i < run.chains.size(); ++i) {
    const ChosenChain& chain = run.chains[i];
    const fs::path file = unpacked / (key_of[i] + ".a3m");
    KUAFU_CHECK(!key_of[i].empty() && fs::exists(file), "mmseqs wrote no MSA for ", chain.id, " (", file.string(), ")");
    std::string a3m = read_file(file.string());
    a3m.erase(std::remove(a3m.begin(), a3m.end(), '\0'), a3m.end());
    auto [kept, rows] = drop_own_row(a3m, chain.id);
    const Msa parsed = parse_a3m(kept, file.string());
    KUAFU_CHECK(parsed.sequences[0] == chain.sequence, file.string(), ": its first row is not ", chain.id,
                "'s sequence");
    write_text(out / "msas" / (chain.id + ".a3m"), kept);
    run.msa_depth[i] = rows;
  }
  run.summary.msa_seconds = seconds_since(start);
}

void summarise(Run& run) {
  DataRecipeSummary& s = run.summary;
  s.chains = run.chains.size();
  std::set<size_t> clusters, groups;
  std::array<std::set<size_t>, 3> split_clusters;
  for (size_t i = 0; i < run.chains.size(); ++i) {
    clusters.insert(run.cluster_of[i]);
    groups.insert(run.group_of[i]);
    const auto split = static_cast<size_t>(run.split_of[i]);
    ++s.split_chains[split];
    split_clusters[split].insert(run.cluster_of[i]);
  }
  s.clusters = clusters.size();
  s.groups = groups.size();
  s.cross_links = run.links.size();
  for (size_t k = 0; k < 3; ++k) s.split_clusters[k] = split_clusters[k].size();
  if (!run.msa_depth.empty()) {
    std::vector<size_t> depth = run.msa_depth;
    std::sort(depth.begin(), depth.end());
    s.msa_min_depth = depth.front();
    s.msa_max_depth = depth.back();
    s.msa_median_depth = depth[depth.size() / 2];
    s.msa_mean_depth = std::accumulate(depth.begin(), depth.end(), 0.0) / static_cast<double>(depth.size());
    s.msa_query_only = static_cast<size_t>(std::count(depth.begin(), depth.end(), size_t{1}));
  }
}

void write_tables(const Run& run, const Mmseqs& mmseqs, const fs::path& out) {
  const DataRecipeOptions& o = run.options;
  std::string chains = "chain_id\tdb_index\tlength\tsplit\tcluster\tgroup\n";
  for (size_t i = 0; i < run.chains.size(); ++i) {
    const ChosenChain& c = run.chains[i];
    chains += detail::concat(c.id, '\t', c.db_index, '\t', c.sequence.size(), '\t', split_name(run.split_of[i]), '\t',
                             run.chains[run.cluster_of[i]].id, '\t', run.chains[run.group_of[i]].id, '\n');
  }
  write_text(out / "chains.tsv", chains);
  // MMseqs2 writes its clusters in an order that varies with its threads: these go in the database's.
  std::map<size_t, std::vector<size_t>> clusters;
  for (size_t i = 0; i < run.chains.size(); ++i) clusters[run.cluster_of[i]].push_back(i);
  std::string cluster_text;
  for (const auto& [representative, members] : clusters) {
    for (size_t m : members) cluster_text += run.chains[representative].id + "\t" + run.chains[m].id + "\n";
  }
  write_text(out / "clusters.tsv", cluster_text);
  std::string links = "query\ttarget\tidentity\tquery_coverage\ttarget_coverage\n";
  for (const auto& [pair, values] : run.links) {
    const std::vector<std::string> fields = {run.chains[pair.first].id, run.chains[pair.second].id, values[0],
                                             values[1], values[2]};
    links += text::join(fields, "\t") + "\n";
  }
  write_text(out / "links.tsv", links);

  const DataRecipeSummary& s = run.summary;
  json splits = json::object();
  json counts = {{"chains", s.chains}, {"clusters", s.clusters}, {"cross_links", s.cross_links}, {"groups", s.groups}};
  for (Split split : kSplits) {
    json list = json::array();
    for (size_t i = 0; i < run.chains.size(); ++i) {
      if (run.split_of[i] == split) list.push_back({{"id", run.chains[i].id}, {"db_index", run.chains[i].db_index}});
    }
    splits[split_name(split)] = std::move(list);
    const auto k = static_cast<size_t>(split);
    counts[split_name(split)] = {{"chains", s.split_chains[k]}, {"clusters", s.split_clusters[k]}};
  }
  if (o.msa.build) {
    counts["msa_depth"] = {{"min", s.msa_min_depth}, {"median", s.msa_median_depth}, {"mean", s.msa_mean_depth},
                           {"max", s.msa_max_depth}, {"query_only", s.msa_query_only}};
  }
  const ChainSelection& sel = o.selection;
  const ClusterOptions& c = o.cluster;
  const MsaOptions& m = o.msa;
  const json manifest = {
      {"structure_db", o.structure_db},
      {"mmseqs_version", s.mmseqs_version},
      {"selection", {{"min_length", sel.min_length}, {"max_length", sel.max_length}, {"max_chains", sel.max_chains},
                     {"seed", sel.seed}, {"one_chain_per_sequence", true}}},
      {"cluster", {{"min_seq_id", c.min_seq_id}, {"coverage", c.coverage}, {"cov_mode", c.cov_mode},
                   {"cluster_mode", c.cluster_mode}, {"sensitivity", c.sensitivity},
                   {"clusters_linked_by_all_pairs_alignment", true}}},
      {"split", {{"train", o.split.train}, {"val", o.split.val}, {"test", o.split.test}, {"seed", o.split.seed}}},
      {"msa", {{"build", m.build}, {"targets", "train"}, {"num_iterations", m.num_iterations},
               {"sensitivity", m.sensitivity}, {"evalue", m.evalue}, {"max_seqs", m.max_seqs}}},
      {"commands", mmseqs.commands()},
      {"counts", counts},
      {"splits", splits}};
  write_text(out / "manifest.json", manifest.dump(1) + "\n");
}

// Makes what was written durable before the folder is renamed into place: one syncfs rather than an
// fsync a file (a run over the whole database writes 20,000 MSAs).
void sync_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  KUAFU_CHECK(fd >= 0, "cannot open ", folder.string(), ": ", std::strerror(errno));
  const int rc = ::syncfs(fd);
  ::close(fd);
  KUAFU_CHECK(rc == 0, "cannot sync ", folder.string(), ": ", std::strerror(errno));
}

}  // namespace

const char* split_name(Split split) {
  switch (split) {
    case Split::kTrain: return "train";
    case Split::kVal: return "val";
    case Split::kTest: return "test";
  }
  return "?";
}

std::vector<ChosenChain> select_chains(const StructureDb& db, const ChainSelection& selection) {
  KUAFU_CHECK(selection.min_length >= 1 && selection.min_length <= selection.max_length,
              "chain selection needs 1 <= min_length <= max_length, found min_length ", selection.min_length,
              " and max_length ", selection.max_length);
  std::unordered_set<std::string> only(selection.only.begin(), selection.only.end()), found;
  std::unordered_set<std::string> sequences, ids;
  std::vector<ChosenChain> chosen;
  for (size_t i = 0; i < db.num_chains(); ++i) {
    const ChainRecord& record = db.records()[i];
    std::string id = record.pdb_id + "_" + record.chain_name;
    KUAFU_CHECK(ids.insert(id).second, db.path(), ": chain ", i, " is named ", id,
                " like an earlier one; chains name their files, so names must be unique");
    if (!only.empty()) {
      if (!only.count(id)) continue;
      found.insert(id);
    }
    if (record.size < selection.min_length || record.size > selection.max_length) continue;
    StructureChain chain = db.chain(i);
    if (!sequences.insert(chain.sequence).second) continue;
    chosen.push_back({std::move(id), i, std::move(chain.sequence)});
  }
  for (const std::string& id : selection.only) {
    KUAFU_CHECK(found.count(id), db.path(), ": has no chain ", text::abbreviate(id),
                " (selection.only names chains as PDB id, '_', chain name: 12AS_A)");
  }
  if (selection.max_chains == 0 || chosen.size() <= selection.max_chains) return chosen;
  std::vector<std::pair<uint64_t, size_t>> draws;
  for (size_t k = 0; k < chosen.size(); ++k) {
    draws.emplace_back(mix_seed(selection.seed, static_cast<int64_t>(chosen[k].db_index), 0, kSubsetStream), k);
  }
  std::nth_element(draws.begin(), draws.begin() + static_cast<std::ptrdiff_t>(selection.max_chains), draws.end());
  draws.resize(selection.max_chains);
  std::sort(draws.begin(), draws.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::vector<ChosenChain> subset;
  for (const auto& draw : draws) subset.push_back(std::move(chosen[draw.second]));
  return subset;
}

std::vector<Split> assign_splits(const std::vector<std::vector<size_t>>& groups, const std::vector<size_t>& chain_keys,
                                 const SplitOptions& options) {
  const std::array<double, 3> fractions = {options.train, options.val, options.test};
  for (Split split : kSplits) {
    const double f = fractions[static_cast<size_t>(split)];
    KUAFU_CHECK(f >= 0 && f <= 1, "split: the ", split_name(split), " fraction must lie in [0, 1], found ", f);
  }
  KUAFU_CHECK(options.train > 0, "split: the train fraction must be positive (the MSAs search the training chains)");
  KUAFU_CHECK(std::abs(options.train + options.val + options.test - 1) < 1e-6,
              "split: the train, val and test fractions must sum to 1, found ", options.train, " + ", options.val,
              " + ", options.test);
  const size_t n = chain_keys.size();
  std::vector<Split> result(n, Split::kTrain);
  std::vector<char> seen(n, 0);
  std::vector<std::pair<uint64_t, size_t>> order;  // (draw, group)
  for (size_t g = 0; g < groups.size(); ++g) {
    KUAFU_CHECK(!groups[g].empty(), "split: group ", g, " is empty");
    size_t key = SIZE_MAX;
    for (size_t chain : groups[g]) {
      KUAFU_CHECK(chain < n && !seen[chain], "split: chain ", chain, " is out of range or in two groups");
      seen[chain] = 1;
      key = std::min(key, chain_keys[chain]);
    }
    order.emplace_back(mix_seed(options.seed, static_cast<int64_t>(key), 0, kSplitStream), g);
  }
  KUAFU_CHECK(std::count(seen.begin(), seen.end(), 0) == 0, "split: some chains are in no group");
  std::sort(order.begin(), order.end());
  const auto val_target = static_cast<int64_t>(std::llround(options.val * static_cast<double>(n)));
  const auto test_target = static_cast<int64_t>(std::llround(options.test * static_cast<double>(n)));
  const std::array<int64_t, 3> target = {static_cast<int64_t>(n) - val_target - test_target, val_target, test_target};
  std::array<int64_t, 3> count{};
  for (const auto& [draw, g] : order) {
    size_t best = 0;
    for (size_t s = 1; s < 3; ++s) {
      if (fractions[s] > 0 && target[s] - count[s] > target[best] - count[best]) best = s;
    }
    for (size_t chain : groups[g]) result[chain] = static_cast<Split>(best);
    count[best] += static_cast<int64_t>(groups[g].size());
  }
  return result;
}

DataRecipeSummary run_data_recipe(const DataRecipeOptions& options) {
  const auto start = Clock::now();
  check_options(options);
  fs::path out = fs::absolute(options.out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "out/": the folder, not something inside it
  const bool exists = fs::exists(out);
  KUAFU_CHECK(!exists || options.overwrite, out.string(), " already exists; write into a new folder, or ask for "
              "overwrite (the old folder is replaced only once the new one is complete)");
  KUAFU_CHECK(!exists || fs::is_directory(out), out.string(), " exists and is not a folder; it is never replaced");
  const std::string program = find_program(options.mmseqs);
  const char* path = std::getenv("PATH");
  KUAFU_CHECK(!program.empty(), "data recipe: ", options.mmseqs, " not found (PATH=", path ? path : "<unset>",
              "); install Debian's mmseqs2 (scripts/setup does) or give the path of the mmseqs binary");
  const int threads = options.threads > 0 ? options.threads
                                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Mmseqs mmseqs(program, threads);

  Run run{options, {}, {}, {}, {}, {}, {}, {}, {}};
  run.summary.mmseqs_version = text::trim(mmseqs.run({"version"}, false));
  const auto select_start = Clock::now();
  const StructureDb db = read_structure_db(options.structure_db, StructureDbParts{false, false, false});
  run.chains = select_chains(db, options.selection);
  KUAFU_CHECK(!run.chains.empty(), options.structure_db, ": no chain has ", options.selection.min_length, " to ",
              options.selection.max_length, " residues");
  for (size_t i = 0; i < run.chains.size(); ++i) run.by_id[run.chains[i].id] = i;
  run.summary.select_seconds = seconds_since(select_start);
  log::infof("data recipe: ", run.chains.size(), " chains from ", options.structure_db, " into ", out.string());

  const auto fill = [&](const fs::path& building) {
    mmseqs.set_folder(building);
    const fs::path work = building / "work";
    fs::create_directories(work / "tmp");
    std::vector<size_t> every(run.chains.size());
    std::iota(every.begin(), every.end(), size_t{0});
    const fs::path sequences = building / "sequences.fasta";
    write_text(sequences, fasta(run.chains, every));
    cluster_chains(run, mmseqs, sequences, work);
    const fs::path all = work / "all";
    mmseqs.run({"createdb", sequences.string(), all.string()}, false);
    link_clusters(run, mmseqs, all, work);
    split_groups(run);
    if (options.msa.build) build_msas(run, mmseqs, all, work, building);
    summarise(run);
    write_tables(run, mmseqs, building);
    fs::remove_all(work);
    sync_folder(building);
  };
  if (exists) {
    replace_folder(out, fill);
  } else {
    write_folder_atomic(out.string(), fill);
  }
  DataRecipeSummary& s = run.summary;
  s.total_seconds = seconds_since(start);
  log::infof("data recipe: ", s.chains, " chains, ", s.clusters, " clusters, ", s.groups, " groups; train ",
             s.split_chains[0], ", val ", s.split_chains[1], ", test ", s.split_chains[2], " chains; ",
             s.total_seconds, " s");
  return s;
}

}  // namespace kuafu::fold

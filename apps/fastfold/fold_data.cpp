#include "apps/fastfold/fold_data.h"

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>

#include <torch/torch.h>

#include "apps/fastfold/alignment_files.h"
#include "apps/fastfold/feature_cache.h"
#include "apps/fastfold/residue_types.h"
#include "apps/fastfold/rigid.h"
#include "apps/fastfold/structure_labels.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace kuafu::fold {

FoldChain chain_from_database(const StructureChain& chain, const std::string& id) {
  const int64_t n = static_cast<int64_t>(chain.sequence.size());
  FoldChain out;
  out.id = id;
  out.sequence = chain.sequence;
  out.dssp = chain.dssp;
  out.aatype = torch::empty({n}, torch::kInt64);
  out.residue_index = torch::arange(chain.start_resnum, chain.start_resnum + n, torch::kInt64);
  out.positions = torch::zeros({n, kAtom37, 3});
  out.mask = torch::zeros({n, kAtom37});
  out.recorded_atoms = torch::zeros({kAtom37});
  const int atoms[] = {atom37_index("N"), atom37_index("CA"), atom37_index("C"), atom37_index("O")};
  for (const int a : atoms) out.recorded_atoms[a] = 1.0;
  for (int64_t r = 0; r < n; ++r) {
    out.aatype[r] = residue_type_index(chain.sequence[r]);
    const BackboneResidue& b = chain.backbone[r];
    const Vec3f* xyz[] = {&b.n, &b.ca, &b.c, &b.o};
    for (int a = 0; a < 4; ++a) {
      for (int x = 0; x < 3; ++x) out.positions[r][atoms[a]][x] = (*xyz[a])[x];
      out.mask[r][atoms[a]] = 1.0;
    }
  }
  out.msa = {out.aatype.unsqueeze(0), torch::zeros({1, n})};  // the sequence alone until an MSA is read
  return out;
}

FoldChain crop_chain(const FoldChain& chain, int64_t start, int64_t crop) {
  const int64_t n = chain.aatype.size(0), length = std::min(crop, n - start);
  FoldChain out = chain;
  out.sequence = chain.sequence.substr(start, length);
  if (!chain.dssp.empty()) out.dssp = chain.dssp.substr(start, length);
  out.aatype = chain.aatype.narrow(0, start, length);
  out.residue_index = chain.residue_index.narrow(0, start, length);
  out.positions = chain.positions.narrow(0, start, length);
  out.mask = chain.mask.narrow(0, start, length);
  out.msa = {chain.msa.rows.narrow(1, start, length), chain.msa.deletions.narrow(1, start, length)};
  if (chain.profile.defined()) out.profile = chain.profile.narrow(0, start, length);
  return out;
}

MsaTensors profile_rows(const FoldChain& chain, int64_t rows, torch::Generator& generator) {
  const int64_t n = chain.profile.size(0);
  const torch::Tensor drawn = torch::multinomial(chain.profile.clamp_min(1e-6), rows, /*replacement=*/true, generator);  // [R, rows]
  return {drawn.transpose(0, 1).contiguous(), torch::zeros({rows, n})};
}

std::pair<torch::Tensor, torch::Tensor> pseudo_beta_or_virtual(const torch::Tensor& aatype, const torch::Tensor& positions,
                                                               const torch::Tensor& mask) {
  auto [beta, beta_mask] = pseudo_beta(aatype, positions, mask);
  const int64_t n = atom37_index("N"), ca = atom37_index("CA"), c = atom37_index("C");
  const torch::Tensor virtual_cb = virtual_beta(positions.select(1, n), positions.select(1, ca), positions.select(1, c));
  const torch::Tensor backbone = mask.select(1, n) * mask.select(1, ca) * mask.select(1, c);
  const torch::Tensor use_virtual = (beta_mask == 0) & (backbone > 0);
  return {torch::where(use_virtual.unsqueeze(-1), virtual_cb, beta), torch::where(use_virtual, backbone, beta_mask)};
}

FoldExample make_example(const FoldChain& chain, const ResidueGeometry& geometry, const MsaSampling& sampling,
                         int64_t iterations, double clamped_fape_fraction, torch::Generator& generator,
                         int64_t extra_profile_rows) {
  FoldExample example;
  MsaSample last;
  MsaTensors msa = chain.msa;
  if (extra_profile_rows > 0 && chain.profile.defined()) {
    const MsaTensors drawn = profile_rows(chain, extra_profile_rows, generator);
    msa = {torch::cat({msa.rows, drawn.rows}), torch::cat({msa.deletions, drawn.deletions})};
  }
  const torch::Tensor profile = msa_column_profile(msa);
  for (int64_t i = 0; i < iterations; ++i) {
    last = sample_msa_features(chain.aatype, chain.residue_index, msa, sampling, generator, profile);
    example.iterations.push_back(last.features);
  }
  AlphaFoldLabels& labels = example.labels;
  labels.positions = chain.positions;
  labels.mask = chain.mask;
  labels.recorded_atoms = chain.recorded_atoms;
  labels.structure = structure_labels(geometry, chain.aatype, chain.positions, chain.mask, torch::ones({chain.aatype.size(0)}),
                                      clamped_fape_fraction);
  std::tie(labels.pseudo_beta, labels.pseudo_beta_mask) = pseudo_beta_or_virtual(chain.aatype, chain.positions, chain.mask);
  labels.true_msa = last.true_msa;
  labels.bert_mask = last.bert_mask;
  // The database records no resolution: one inside AlphaFold's 0.1-3 Å window, so pLDDT trains on every chain.
  labels.resolution = 2.0;
  return example;
}

namespace {

// `t` with zeros after its end along `dim` up to the next multiple of `multiple`.
torch::Tensor pad_to_multiple(const torch::Tensor& t, int64_t dim, int64_t multiple) {
  const int64_t extra = (multiple - t.size(dim) % multiple) % multiple;
  if (extra == 0) return t;
  std::vector<int64_t> pads(2 * static_cast<size_t>(t.dim()), 0);  // (before, after) from the last dim back
  pads[2 * static_cast<size_t>(t.dim() - 1 - dim) + 1] = extra;
  return torch::constant_pad_nd(t, pads, 0);
}

}  // namespace

FoldExample pad_example(const FoldExample& example, int64_t multiple) {
  if (multiple <= 1) return example;
  const auto residues = [multiple](torch::Tensor& t) { t = pad_to_multiple(t, 0, multiple); };
  const auto rows_and_residues = [multiple](torch::Tensor& t) { t = pad_to_multiple(pad_to_multiple(t, 0, multiple), 1, multiple); };
  FoldExample padded = example;
  for (AlphaFoldFeatures& f : padded.iterations) {
    for (torch::Tensor* t : {&f.aatype, &f.residue_index, &f.seq_mask, &f.target_feat}) residues(*t);
    for (torch::Tensor* t : {&f.msa_feat, &f.msa_mask, &f.extra_msa, &f.extra_has_deletion, &f.extra_deletion_value, &f.extra_msa_mask})
      rows_and_residues(*t);
  }
  AlphaFoldLabels& l = padded.labels;
  for (torch::Tensor* t : {&l.positions, &l.mask, &l.pseudo_beta, &l.pseudo_beta_mask}) residues(*t);
  for (torch::Tensor* t : {&l.true_msa, &l.bert_mask}) rows_and_residues(*t);
  StructureLabels& s = l.structure;
  for (torch::Tensor* t : {&s.aatype, &s.residue_mask, &s.atom14_positions, &s.atom14_exists, &s.atom14_alt_positions, &s.atom14_alt_exists,
                           &s.atom14_ambiguous, &s.atom14_type_exists, &s.group_exists, &s.backbone_mask, &s.chi_angles, &s.chi_mask,
                           &s.group_frames.rotation, &s.group_frames.translation, &s.alt_group_frames.rotation,
                           &s.alt_group_frames.translation, &s.backbone.rotation, &s.backbone.translation})
    residues(*t);
  return padded;
}

DatabaseSource DatabaseSource::file(const std::string& path) {
  DatabaseSource source;
  source.path_ = path;
  return source;
}

const StructureDb& DatabaseSource::get() const {
  if (db_) return *db_;
  if (!read_) read_ = std::make_shared<StructureDb>(read_structure_db(path_));  // read once
  return *read_;
}

namespace {

using ChainFilter = std::function<bool(const std::string& id, const std::string& split)>;

// Every chain of chains.tsv that `keep(id, split)` selects, with its split, from the folder's sources: its
// backbone (and profile, when asked) from the database and its MSA from its a3m file; only those are read.
std::vector<SplitChain> read_from_sources(const std::string& folder, const DatabaseSource& source, bool with_profiles,
                                          const ChainFilter& keep) {
  const std::filesystem::path dir(folder);
  const std::filesystem::path table = dir / "chains.tsv";
  std::ifstream in(table);
  KUAFU_CHECK(in, table.string(), ": cannot be read (run `kuafu-fold prepare` to make ", folder, ")");
  std::vector<SplitChain> chains;
  std::string line;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty() || line[0] == '#' || line.rfind("chain_id", 0) == 0) continue;
    std::istringstream fields(line);
    std::string id, index, length, chain_split;
    KUAFU_CHECK(static_cast<bool>(fields >> id >> index >> length >> chain_split), table.string(), ":", line_number,
                ": expected chain_id db_index length split ..., found '", line, "'");
    if (!keep(id, chain_split)) continue;
    size_t db_index = 0;
    try {
      db_index = std::stoul(index);
    } catch (const std::exception&) {
      throw Error(table.string() + ":" + std::to_string(line_number) + ": db_index '" + index + "' is not a number");
    }
    const StructureDb& db = source.get();
    KUAFU_CHECK(db_index < db.num_chains(), table.string(), ":", line_number, ": chain ", id, " has db_index ", db_index,
                ", past the structure database's ", db.num_chains(), " chains (", db.path(), ")");
    FoldChain chain = chain_from_database(db.chain(db_index), id);
    if (with_profiles) {
      // The database's columns are in ProfileColumn order ("ACDEFGHIKLMNPQRSTVWY"): to AlphaFold's classes.
      const std::vector<ProfileColumn> columns = db.sequence_profile(db_index);
      chain.profile = torch::zeros({static_cast<int64_t>(columns.size()), kResidueTypes + 1});
      for (size_t r = 0; r < columns.size(); ++r)
        for (int a = 0; a < 20; ++a) chain.profile[static_cast<int64_t>(r)][residue_type_index(kProfileOrder[a])] = columns[r][a];
    }
    const std::filesystem::path a3m = dir / "msas" / (id + ".a3m");
    if (std::filesystem::exists(a3m)) {
      const Msa msa = read_alignment(a3m.string(), AlignmentFormat::kA3m);
      KUAFU_CHECK(!msa.sequences.empty() && msa.sequences[0] == chain.sequence, a3m.string(),
                  ": its first row is not chain ", id, "'s sequence in the structure database");
      chain.msa = msa_tensors(msa);
    }
    chains.push_back({std::move(chain), chain_split});
  }
  return chains;
}

std::vector<FoldChain> read_prepared_chains(const std::string& folder, const DatabaseSource& db, bool with_profiles, const ChainFilter& keep) {
  const std::filesystem::path dir(folder);
  const std::filesystem::path table = dir / "chains.tsv";
  KUAFU_CHECK(std::filesystem::exists(table), table.string(), ": cannot be read (run `kuafu-fold prepare` to make ", folder, ")");
  if (auto cached = read_feature_cache((dir / kFeatureCacheFile).string(), file_crc32(table.string()), with_profiles, keep)) return *cached;
  std::vector<FoldChain> chains;
  for (SplitChain& item : read_from_sources(folder, db, with_profiles, keep)) chains.push_back(std::move(item.chain));
  return chains;
}

}  // namespace

std::vector<FoldChain> read_prepared_split(const std::string& folder, const std::string& split, const DatabaseSource& db,
                                           bool with_profiles) {
  return read_prepared_chains(folder, db, with_profiles, [&split](const std::string&, const std::string& s) { return s == split; });
}

FoldChain read_prepared_chain(const std::string& folder, const std::string& id, const DatabaseSource& db, bool with_profiles) {
  std::vector<FoldChain> found =
      read_prepared_chains(folder, db, with_profiles, [&id](const std::string& chain, const std::string&) { return chain == id; });
  KUAFU_CHECK(!found.empty(), "no chain ", id, " in ", (std::filesystem::path(folder) / "chains.tsv").string());
  return std::move(found.front());
}

std::string write_prepared_cache(const std::string& folder, const DatabaseSource& db) {
  const std::filesystem::path dir(folder);
  const std::string table = (dir / "chains.tsv").string(), path = (dir / kFeatureCacheFile).string();
  write_feature_cache(path, read_from_sources(folder, db, /*with_profiles=*/true, [](const std::string&, const std::string&) { return true; }),
                      file_crc32(table));
  return path;
}

}  // namespace kuafu::fold

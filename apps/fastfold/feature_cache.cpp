#include "apps/fastfold/feature_cache.h"

#include <H5Cpp.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include <torch/torch.h>

#include "apps/fastfold/residue_types.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace kuafu::fold {
namespace {

constexpr int64_t kBackboneAtoms = 4;  // N, CA, C, O: what the structure database keeps
constexpr size_t kTableColumns = 5;    // first residue, residues, first MSA entry, MSA rows, first residue number

template <class T>
void write_array(H5::H5File& file, const std::string& name, const std::vector<T>& values, std::vector<hsize_t> dims,
                 const H5::PredType& type) {
  const H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  H5::DataSet dataset = file.createDataSet(name, type, space);
  if (!values.empty()) dataset.write(values.data(), type);
}

// Reads rows [first, first + count) of dataset `name` (whose rows are `width` values) into a vector.
template <class T>
std::vector<T> read_rows(const H5::H5File& file, const std::string& path, const std::string& name, hsize_t first, hsize_t count,
                         const H5::PredType& type) {
  try {
    const H5::DataSet dataset = file.openDataSet(name);
    H5::DataSpace space = dataset.getSpace();
    const int rank = space.getSimpleExtentNdims();
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    space.getSimpleExtentDims(dims.data());
    KUAFU_CHECK(rank >= 1 && first + count <= dims[0], "feature cache ", path, ": dataset '", name, "' has ", rank >= 1 ? dims[0] : 0,
                " rows, wanted rows ", first, "..", first + count);
    hsize_t width = 1;
    for (int d = 1; d < rank; ++d) width *= dims[static_cast<size_t>(d)];
    std::vector<T> values(static_cast<size_t>(count * width));
    if (count == 0) return values;
    std::vector<hsize_t> offset(static_cast<size_t>(rank), 0), extent = dims;
    offset[0] = first;
    extent[0] = count;
    space.selectHyperslab(H5S_SELECT_SET, extent.data(), offset.data());
    const H5::DataSpace memory(rank, extent.data());
    dataset.read(values.data(), type, memory, space);
    return values;
  } catch (const H5::Exception& e) {
    fail(detail::concat("feature cache ", path, ": dataset '", name, "' does not read (", e.getDetailMsg(), ")"));
  }
}

template <class T>
std::vector<T> read_all(const H5::H5File& file, const std::string& path, const std::string& name, const H5::PredType& type) {
  hsize_t rows = 0;
  try {
    H5::DataSpace space = file.openDataSet(name).getSpace();
    std::vector<hsize_t> dims(static_cast<size_t>(space.getSimpleExtentNdims()));
    space.getSimpleExtentDims(dims.data());
    rows = dims.empty() ? 0 : dims[0];
  } catch (const H5::Exception& e) {
    fail(detail::concat("feature cache ", path, ": no dataset '", name, "' (", e.getDetailMsg(), ")"));
  }
  return read_rows<T>(file, path, name, 0, rows, type);
}

}  // namespace

void write_feature_cache(const std::string& path, const std::vector<SplitChain>& chains, uint32_t source_crc) {
  std::string names;
  std::vector<int64_t> table;
  std::vector<uint8_t> sequence, dssp, msa;
  std::vector<float> backbone, profile;
  std::vector<int32_t> deletions;
  const torch::Tensor atoms = torch::tensor({atom37_index("N"), atom37_index("CA"), atom37_index("C"), atom37_index("O")}, torch::kInt64);
  for (const SplitChain& item : chains) {
    const FoldChain& c = item.chain;
    const int64_t n = c.aatype.size(0), rows = c.msa.rows.size(0);
    KUAFU_CHECK(c.profile.defined() && c.profile.size(0) == n, "feature cache: chain ", c.id, " has no profile of its ", n, " residues");
    KUAFU_CHECK(static_cast<int64_t>(c.dssp.size()) == n, "feature cache: chain ", c.id, " has ", c.dssp.size(), " DSSP states for ", n, " residues");
    // A database chain (chain_from_database's): numbered on from its first residue, its four backbone atoms
    // present, nothing else; the reader rebuilds it from these through chain_from_database.
    const int64_t start = n > 0 ? c.residue_index[0].item<int64_t>() : 0;
    KUAFU_CHECK(torch::equal(c.residue_index.to(torch::kInt64), torch::arange(start, start + n, torch::kInt64)) &&
                    c.mask.index_select(1, atoms).all().item<bool>() && c.mask.sum().item<double>() == static_cast<double>(kBackboneAtoms * n),
                "feature cache: chain ", c.id, " is not a structure database chain (residues numbered on, N, CA, C and O only)");
    names += c.id + "\t" + item.split + "\n";
    table.insert(table.end(), {static_cast<int64_t>(sequence.size()), n, static_cast<int64_t>(msa.size()), rows, start});
    sequence.insert(sequence.end(), c.sequence.begin(), c.sequence.end());
    dssp.insert(dssp.end(), c.dssp.begin(), c.dssp.end());
    const torch::Tensor positions = c.positions.index_select(1, atoms).to(torch::kFloat32).contiguous();  // [R, 4, 3]
    backbone.insert(backbone.end(), positions.data_ptr<float>(), positions.data_ptr<float>() + positions.numel());
    const torch::Tensor p = c.profile.to(torch::kFloat32).contiguous();
    profile.insert(profile.end(), p.data_ptr<float>(), p.data_ptr<float>() + p.numel());
    const torch::Tensor r = c.msa.rows.to(torch::kUInt8).contiguous(), d = c.msa.deletions.to(torch::kInt32).contiguous();
    msa.insert(msa.end(), r.data_ptr<uint8_t>(), r.data_ptr<uint8_t>() + r.numel());
    deletions.insert(deletions.end(), d.data_ptr<int32_t>(), d.data_ptr<int32_t>() + d.numel());
  }
  const std::string building = path + ".partial-" + std::to_string(::getpid());
  try {
    H5::Exception::dontPrint();
    H5::H5File file(building, H5F_ACC_TRUNC);
    const hsize_t residues = sequence.size(), entries = msa.size();
    write_array(file, "source_crc32", std::vector<uint32_t>{source_crc}, {1}, H5::PredType::NATIVE_UINT32);
    write_array(file, "chains", std::vector<uint8_t>(names.begin(), names.end()), {names.size()}, H5::PredType::NATIVE_UINT8);
    write_array(file, "table", table, {chains.size(), kTableColumns}, H5::PredType::NATIVE_INT64);
    write_array(file, "sequence", sequence, {residues}, H5::PredType::NATIVE_UINT8);
    write_array(file, "backbone", backbone, {residues, kBackboneAtoms, 3}, H5::PredType::NATIVE_FLOAT);
    write_array(file, "dssp", dssp, {residues}, H5::PredType::NATIVE_UINT8);
    write_array(file, "profile", profile, {residues, static_cast<hsize_t>(kResidueTypes + 1)}, H5::PredType::NATIVE_FLOAT);
    write_array(file, "msa", msa, {entries}, H5::PredType::NATIVE_UINT8);
    write_array(file, "deletions", deletions, {entries}, H5::PredType::NATIVE_INT32);
    file.close();
  } catch (const H5::Exception& e) {
    std::filesystem::remove(building);
    fail(detail::concat("feature cache ", path, ": cannot be written (", e.getDetailMsg(), ")"));
  }
  rename_durable(building, path);
}

std::optional<std::vector<FoldChain>> read_feature_cache(const std::string& path, uint32_t source_crc, bool with_profiles,
                                                         const std::function<bool(const std::string& id, const std::string& split)>& keep) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  H5::Exception::dontPrint();
  std::optional<H5::H5File> opened;
  try {
    opened.emplace(path, H5F_ACC_RDONLY);
  } catch (const H5::Exception& e) {
    fail(detail::concat("feature cache ", path, ": not an HDF5 file (", e.getDetailMsg(), "); remove it to read the folder's sources"));
  }
  const H5::H5File& file = *opened;
  const std::vector<uint32_t> crc = read_all<uint32_t>(file, path, "source_crc32", H5::PredType::NATIVE_UINT32);
  if (crc.size() != 1 || crc[0] != source_crc) return std::nullopt;  // made from another chains.tsv
  const std::vector<uint8_t> names = read_all<uint8_t>(file, path, "chains", H5::PredType::NATIVE_UINT8);
  const std::vector<int64_t> table = read_all<int64_t>(file, path, "table", H5::PredType::NATIVE_INT64);
  std::istringstream lines(std::string(names.begin(), names.end()));
  std::vector<FoldChain> chains;
  std::string line;
  for (size_t c = 0; std::getline(lines, line); ++c) {
    const size_t tab = line.find('\t');
    KUAFU_CHECK(tab != std::string::npos && kTableColumns * (c + 1) <= table.size(), "feature cache ", path, ": chain entry ", c,
                " is malformed");
    const std::string id = line.substr(0, tab), split = line.substr(tab + 1);
    if (!keep(id, split)) continue;
    const int64_t* row = table.data() + kTableColumns * c;
    const auto first = static_cast<hsize_t>(row[0]), n = static_cast<hsize_t>(row[1]);
    const auto entry = static_cast<hsize_t>(row[2]), rows = static_cast<hsize_t>(row[3]);
    const auto r = static_cast<int64_t>(n);
    StructureChain stored;
    stored.start_resnum = static_cast<int>(row[4]);
    const std::vector<uint8_t> sequence = read_rows<uint8_t>(file, path, "sequence", first, n, H5::PredType::NATIVE_UINT8);
    stored.sequence.assign(sequence.begin(), sequence.end());
    const std::vector<uint8_t> dssp = read_rows<uint8_t>(file, path, "dssp", first, n, H5::PredType::NATIVE_UINT8);
    stored.dssp.assign(dssp.begin(), dssp.end());
    const std::vector<float> backbone = read_rows<float>(file, path, "backbone", first, n, H5::PredType::NATIVE_FLOAT);
    stored.backbone.resize(static_cast<size_t>(n));
    for (size_t i = 0; i < stored.backbone.size(); ++i) {
      BackboneResidue& b = stored.backbone[i];
      Vec3f* xyz[] = {&b.n, &b.ca, &b.c, &b.o};
      for (size_t a = 0; a < kBackboneAtoms; ++a) std::copy_n(backbone.begin() + static_cast<std::ptrdiff_t>((i * kBackboneAtoms + a) * 3), 3, xyz[a]->begin());
    }
    FoldChain chain = chain_from_database(stored, id);
    if (with_profiles) {
      chain.profile = torch::tensor(read_rows<float>(file, path, "profile", first, n, H5::PredType::NATIVE_FLOAT)).view({r, kResidueTypes + 1});
    }
    const auto msa_rows = static_cast<int64_t>(rows);
    chain.msa.rows = torch::tensor(read_rows<uint8_t>(file, path, "msa", entry, rows * n, H5::PredType::NATIVE_UINT8))
                         .to(torch::kInt64).view({msa_rows, r});
    chain.msa.deletions = torch::tensor(read_rows<int32_t>(file, path, "deletions", entry, rows * n, H5::PredType::NATIVE_INT32))
                              .to(torch::kFloat32).view({msa_rows, r});
    chains.push_back(std::move(chain));
  }
  return chains;
}

}  // namespace kuafu::fold

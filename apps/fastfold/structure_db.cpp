#include "apps/fastfold/structure_db.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <type_traits>

#include "core/util/error.h"

namespace kuafu::fold {
namespace {

constexpr uint32_t kMagic = 1234;
constexpr uint32_t kVersion = 2;
// ProMod3's check of its types' sizes on the machine that wrote the file (uint, Real, ..., char).
constexpr uint32_t kTypeSizes[] = {4, 4, 2, 8, 2, 6, 88, 40, 24, 6, 4, 1};
constexpr uint64_t kBackboneBytes = 24;  // uint16 [N, CA, C, O][x, y, z]
constexpr uint64_t kProfileBytes = 40;   // int16 [20]

template <size_t N> struct UnsignedOf;
template <> struct UnsignedOf<1> { using type = uint8_t; };
template <> struct UnsignedOf<2> { using type = uint16_t; };
template <> struct UnsignedOf<4> { using type = uint32_t; };
template <> struct UnsignedOf<8> { using type = uint64_t; };

template <typename T>
T from_little_endian(const unsigned char* bytes) {
  using U = typename UnsignedOf<sizeof(T)>::type;
  U bits = 0;
  for (size_t i = 0; i < sizeof(T); ++i) bits = static_cast<U>(bits | (U(bytes[i]) << (8 * i)));
  T value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

bool host_is_little_endian() {
  const uint16_t probe = 1;
  unsigned char first;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

// A whole array of 16-bit values as stored (little endian), fixed up on a big-endian host.
template <typename T>
void to_host_order(std::vector<T>& values) {
  static_assert(sizeof(T) == 2);
  if (host_is_little_endian()) return;
  for (T& v : values) v = from_little_endian<T>(reinterpret_cast<const unsigned char*>(&v));
}

// Reads the file front to back; every error names the file, what was expected and at which byte.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    KUAFU_CHECK(in_, path, ": cannot open the structure database (Debian's promod3-data installs it)");
    in_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(in_.tellg());
    in_.seekg(0);
  }

  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }

  // `count` records of `record_bytes` each must fit before the end of the file.
  void need(uint64_t count, uint64_t record_bytes, const std::string& what) const {
    if (count <= (size_ - offset_) / record_bytes) return;
    const std::string bytes = record_bytes == 1 ? std::to_string(count)
                                                : std::to_string(count) + " × " + std::to_string(record_bytes);
    fail(detail::concat(path_, ": expected ", what, " (", bytes, " bytes) at byte ", offset_,
                        ", but the file ends at byte ", size_));
  }

  void read(void* into, uint64_t bytes, const std::string& what) {
    need(bytes, 1, what);
    in_.read(static_cast<char*>(into), static_cast<std::streamsize>(bytes));
    KUAFU_CHECK(in_, path_, ": cannot read ", what, " at byte ", offset_);
    offset_ += bytes;
  }

  void skip(uint64_t count, uint64_t record_bytes, const std::string& what) {
    need(count, record_bytes, what);
    seek(offset_ + count * record_bytes);
  }

  void seek(uint64_t at) {
    offset_ = at;
    in_.seekg(static_cast<std::streamoff>(at));
  }

  template <typename T>
  T value(const std::string& what) {
    unsigned char bytes[sizeof(T)];
    read(bytes, sizeof bytes, what);
    return from_little_endian<T>(bytes);
  }

  template <typename T>
  void expect(T expected, const std::string& what) {
    const uint64_t at = offset_;
    const T found = value<T>(what);
    KUAFU_CHECK(found == expected, path_, ": expected ", what, " ", +expected, " at byte ", at, ", found ", +found,
                " (not a database written by ProMod3's StructureDB::Save)");
  }

  std::string text(const std::string& what) {
    const auto length = value<uint32_t>(what + "'s length");
    need(length, 1, what);
    std::string s(length, '\0');
    read(s.data(), length, what);
    return s;
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
};

ChainRecord read_record(Reader& in, uint64_t index) {
  const std::string what = "chain " + std::to_string(index) + "'s ";
  ChainRecord r;
  r.pdb_id = in.text(what + "PDB id");
  r.chain_name = in.text(what + "chain name");
  r.offset = in.value<uint32_t>(what + "first residue");
  r.size = in.value<uint16_t>(what + "residue count");
  r.start_resnum = in.value<uint16_t>(what + "first residue number");
  for (float& s : r.shift) s = in.value<float>(what + "shift");
  return r;
}

}  // namespace

bool StructureDb::has(StructureDbData data) const {
  const auto bits = static_cast<int32_t>(data);
  return (stored_ & bits) == bits;
}

const ChainRecord& StructureDb::record(size_t index) const {
  KUAFU_CHECK(index < records_.size(), path_, ": no chain ", index, " (the database has ", records_.size(), ")");
  return records_[index];
}

StructureChain StructureDb::chain(size_t index) const {
  const ChainRecord& r = record(index);
  StructureChain c;
  c.pdb_id = r.pdb_id;
  c.chain_name = r.chain_name;
  c.start_resnum = r.start_resnum;
  c.sequence = sequence_.substr(r.offset, r.size);
  if (!dssp_.empty()) c.dssp = dssp_.substr(r.offset, r.size);
  if (!backbone_.empty()) {
    c.backbone.resize(r.size);
    const uint16_t* stored = backbone_.data() + size_t{r.offset} * 12;
    for (BackboneResidue& residue : c.backbone) {
      for (Vec3f* atom : {&residue.n, &residue.ca, &residue.c, &residue.o}) {
        // ProMod3's own reading (UShortVec::ToVec3), then the shift undone.
        for (int k = 0; k < 3; ++k) (*atom)[k] = static_cast<float>(*stored++ * 0.01) - r.shift[k];
      }
    }
  }
  if (!dihedrals_.empty()) {
    c.phi_psi.resize(r.size);
    const int16_t* stored = dihedrals_.data() + size_t{r.offset} * 2;
    for (auto& angles : c.phi_psi) {
      for (float& a : angles) a = static_cast<float>(*stored++) * 0.001f;  // as DihedralInfo::GetPhi
    }
  }
  return c;
}

std::vector<ProfileColumn> StructureDb::sequence_profile(size_t index) const {
  return profile(index, sequence_profiles_, "sequence profile");
}

std::vector<ProfileColumn> StructureDb::structure_profile(size_t index) const {
  return profile(index, structure_profiles_, "structure profile");
}

std::vector<ProfileColumn> StructureDb::profile(size_t index, uint64_t section, const char* what) const {
  const ChainRecord& r = record(index);
  KUAFU_CHECK(section != 0, path_, " stores no ", what, "s");
  Reader in(path_);
  in.seek(section + uint64_t{r.offset} * kProfileBytes);
  std::vector<int16_t> stored(size_t{r.size} * 20);
  in.read(stored.data(), stored.size() * 2, std::string(what) + " of chain " + std::to_string(index));
  to_host_order(stored);
  std::vector<ProfileColumn> columns(r.size);
  for (size_t i = 0; i < stored.size(); ++i) columns[i / 20][i % 20] = static_cast<float>(stored[i] / 10000.0);
  return columns;
}

StructureDb read_structure_db(const std::string& path, const StructureDbParts& parts) {
  Reader in(path);
  in.expect<uint32_t>(kMagic, "magic number");
  in.expect<uint32_t>(kVersion, "version");
  for (uint32_t size : kTypeSizes) in.expect<uint32_t>(size, "type size");
  in.expect<float>(1.0f, "check value");
  in.expect<uint8_t>(1, "check value");
  in.expect<uint16_t>(1, "check value");
  in.expect<uint64_t>(1, "check value");
  in.expect<int16_t>(1, "check value");

  StructureDb db;
  db.path_ = path;
  db.stored_ = in.value<int32_t>("stored-data bits");
  const auto chains = in.value<uint64_t>("chain count");
  db.records_.reserve(std::min<uint64_t>(chains, in.size() / 28));  // 28: a record's bytes, names empty
  for (uint64_t i = 0; i < chains; ++i) db.records_.push_back(read_record(in, i));

  // First the whole layout, checked against the file's size, then the parts asked for.
  const uint64_t sequence_at = in.offset();
  const auto residues = in.value<uint64_t>("the sequence section's residue count");
  in.skip(residues, 1, "the sequence section");
  for (size_t i = 0; i < db.records_.size(); ++i) {
    const ChainRecord& r = db.records_[i];
    KUAFU_CHECK(uint64_t{r.offset} + r.size <= residues, path, ": chain ", i, " (", r.pdb_id, " ", r.chain_name,
                ") lists residues ", r.offset, "..", uint64_t{r.offset} + r.size, ", but the sequence section at byte ",
                sequence_at, " holds ", residues);
  }
  auto section = [&](const std::string& name, uint64_t record_bytes) {
    const uint64_t at = in.offset();
    const auto count = in.value<uint64_t>("the " + name + " section's residue count");
    KUAFU_CHECK(count == residues, path, ": the ", name, " section at byte ", at, " holds ", count,
                " residues, expected ", residues, " (as the sequence section)");
    const uint64_t data = in.offset();
    in.skip(count, record_bytes, "the " + name + " section");
    return data;
  };
  auto optional = [&](StructureDbData data, const std::string& name, uint64_t record_bytes) -> uint64_t {
    return db.has(data) ? section(name, record_bytes) : 0;
  };
  const uint64_t backbone = section("backbone", kBackboneBytes);
  const uint64_t dihedrals = optional(StructureDbData::kDihedrals, "phi/psi", 4);
  optional(StructureDbData::kSolventAccessibility, "solvent accessibility", 2);
  optional(StructureDbData::kResidueDepth, "residue depth", 2);
  const uint64_t dssp = optional(StructureDbData::kDssp, "DSSP", 1);
  db.sequence_profiles_ = optional(StructureDbData::kSequenceProfile, "sequence profile", kProfileBytes);
  db.structure_profiles_ = optional(StructureDbData::kStructureProfile, "structure profile", kProfileBytes);
  KUAFU_CHECK(in.offset() == in.size(), path, ": expected the end of the file at byte ", in.offset(),
              " after the last section, found ", in.size() - in.offset(), " more bytes");

  db.sequence_.resize(residues);
  in.seek(sequence_at + 8);
  in.read(db.sequence_.data(), residues, "the sequence section");
  if (parts.backbone) {
    db.backbone_.resize(residues * 12);
    in.seek(backbone);
    in.read(db.backbone_.data(), residues * kBackboneBytes, "the backbone section");
    to_host_order(db.backbone_);
  }
  if (parts.dihedrals && dihedrals != 0) {
    db.dihedrals_.resize(residues * 2);
    in.seek(dihedrals);
    in.read(db.dihedrals_.data(), residues * 4, "the phi/psi section");
    to_host_order(db.dihedrals_);
  }
  if (parts.dssp && dssp != 0) {
    db.dssp_.resize(residues);
    in.seek(dssp);
    in.read(db.dssp_.data(), residues, "the DSSP section");
  }
  return db;
}

}  // namespace kuafu::fold

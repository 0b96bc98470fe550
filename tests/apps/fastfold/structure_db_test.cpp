// The reader of ProMod3's structure database (Debian's promod3-data) against ProMod3's own Python
// (structure_db_reference.py, Debian's python3-promod3): chain table, sequences, DSSP, phi/psi, backbones
// and profiles of chosen chains, and the shift's sign on a database built from known coordinates; bond
// lengths over every chain; truncated, foreign and missing files refused with the file named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "apps/fastfold/structure_db.h"
#include "core/util/error.h"
#include "tests/support/run_command.h"
#include "tests/support/test_util.h"

namespace kuafu::fold {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// python3-promod3 is a Debian package: the reference runs under Debian's interpreter, not the venv's.
const std::string kPython = "/usr/bin/python3";
const fs::path kScript = fs::path(KUAFU_SOURCE_DIR) / "tests/apps/fastfold/structure_db_reference.py";

const StructureDb& debian_db() {
  static const StructureDb db = read_structure_db(kDebianStructureDb);
  return db;
}


float distance(const Vec3f& a, const Vec3f& b) {
  return std::sqrt((a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]) + (a[2] - b[2]) * (a[2] - b[2]));
}

float widest_ca_step(const StructureChain& chain) {
  float widest = 0;
  for (size_t i = 1; i < chain.backbone.size(); ++i) {
    widest = std::max(widest, distance(chain.backbone[i - 1].ca, chain.backbone[i].ca));
  }
  return widest;
}

// First, middle, last, longest and shortest chains, and the one with the widest CA–CA step (the
// database holds no gaps: each chain is one stretch, so this is the closest to one).
std::vector<size_t> chosen_chains(const StructureDb& db) {
  const auto& records = db.records();
  const auto by_size = [](const ChainRecord& a, const ChainRecord& b) { return a.size < b.size; };
  std::vector<size_t> chosen = {0, records.size() / 2, records.size() - 1,
                                size_t(std::max_element(records.begin(), records.end(), by_size) - records.begin()),
                                size_t(std::min_element(records.begin(), records.end(), by_size) - records.begin())};
  size_t widest = 0;
  float widest_step = 0;
  for (size_t i = 0; i < db.num_chains(); ++i) {
    const float step = widest_ca_step(db.chain(i));
    if (step > widest_step) widest_step = step, widest = i;
  }
  chosen.push_back(widest);
  return chosen;
}

struct Reference {
  fs::path dir;
  json values;
};

// The reference run once for the process (ProMod3 loads the database in about a second).
const Reference& reference() {
  static const Reference ref = [] {
    const fs::path dir = testing::temp_dir("reference");
    std::string command = kPython + " " + kScript.string() + " " + kDebianStructureDb + " " + dir.string();
    for (size_t index : chosen_chains(debian_db())) command += " " + std::to_string(index);
    const auto run = kuafu::testing::run_command(command);
    if (run.exit_code != 0) {
      throw Error("structure_db_reference.py failed (it needs Debian's python3-promod3):\n" + run.output);
    }
    std::ifstream in(dir / "reference.json");
    return Reference{dir, json::parse(in)};
  }();
  return ref;
}

double max_backbone_difference(const std::vector<BackboneResidue>& ours, const json& theirs) {
  double worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const Vec3f* atoms[] = {&ours[i].n, &ours[i].ca, &ours[i].c, &ours[i].o};
    for (int a = 0; a < 4; ++a) {
      for (int k = 0; k < 3; ++k) worst = std::max(worst, std::abs((*atoms[a])[k] - theirs[i][a][k].get<double>()));
    }
  }
  return worst;
}

double max_profile_difference(const std::vector<ProfileColumn>& ours, const json& theirs) {
  double worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    for (int a = 0; a < 20; ++a) worst = std::max(worst, std::abs(ours[i][a] - theirs[i][a].get<double>()));
  }
  return worst;
}


void write_prefix(const fs::path& from, const fs::path& to, uint64_t bytes) {
  std::ifstream in(from, std::ios::binary);
  std::string data(bytes, '\0');
  in.read(data.data(), static_cast<std::streamsize>(bytes));
  ASSERT_EQ(uint64_t(in.gcount()), bytes) << from;
  std::ofstream(to, std::ios::binary).write(data.data(), static_cast<std::streamsize>(bytes));
}

TEST(StructureDbTest, MatchesProMod3) {
  const StructureDb& db = debian_db();
  const json& ref = reference().values;
  EXPECT_EQ(db.num_chains(), ref["num_chains"].get<size_t>());
  ASSERT_GE(ref["chains"].size(), 6u);
  double coordinates = 0, angles = 0, profiles = 0;
  for (const json& expected : ref["chains"]) {
    const auto index = expected["index"].get<size_t>();
    SCOPED_TRACE("chain " + std::to_string(index));
    const ChainRecord& record = db.records()[index];
    EXPECT_EQ(record.pdb_id, expected["pdb_id"].get<std::string>());
    EXPECT_EQ(record.chain_name, expected["chain_name"].get<std::string>());
    EXPECT_EQ(record.offset, expected["offset"].get<uint32_t>());
    EXPECT_EQ(record.size, expected["size"].get<uint16_t>());
    EXPECT_EQ(record.start_resnum, expected["start_resnum"].get<uint16_t>());
    for (int k = 0; k < 3; ++k) EXPECT_EQ(record.shift[k], expected["shift"][k].get<float>());

    std::cout << "chain " << index << ": " << record.pdb_id << " " << record.chain_name << ", " << record.size
              << " residues\n";
    const StructureChain chain = db.chain(index);
    EXPECT_EQ(chain.sequence, expected["sequence"].get<std::string>());
    EXPECT_EQ(chain.dssp, expected["dssp"].get<std::string>());
    ASSERT_EQ(chain.backbone.size(), expected["backbone"].size());
    ASSERT_EQ(chain.phi_psi.size(), expected["phi_psi"].size());
    coordinates = std::max(coordinates, max_backbone_difference(chain.backbone, expected["backbone"]));
    for (size_t i = 0; i < chain.phi_psi.size(); ++i) {
      for (int k = 0; k < 2; ++k) {
        angles = std::max(angles, std::abs(chain.phi_psi[i][k] - expected["phi_psi"][i][k].get<double>()));
      }
    }
    const auto sequence_profile = db.sequence_profile(index);
    const auto structure_profile = db.structure_profile(index);
    ASSERT_EQ(sequence_profile.size(), expected["sequence_profile"].size());
    ASSERT_EQ(structure_profile.size(), expected["structure_profile"].size());
    profiles = std::max({profiles, max_profile_difference(sequence_profile, expected["sequence_profile"]),
                         max_profile_difference(structure_profile, expected["structure_profile"])});
  }
  std::cout << "max difference from ProMod3: coordinates " << coordinates << " Å, phi/psi " << angles
            << " rad, profiles " << profiles << "\n";
  // Both sides decode the same stored integers (0.01 Å, 0.001 rad, 1e-4): what differs is float rounding
  // (~1e-5 Å at the stored values' 250 Å); one stored step off would be 1e-2 Å.
  EXPECT_LE(coordinates, 1e-3);
  EXPECT_LE(angles, 1e-6);
  EXPECT_LE(profiles, 1e-6);
}

// ProMod3 never undoes the shift itself: a database it built from known coordinates shows the sign.
TEST(StructureDbTest, ShiftProbeGivesThePdbFrame) {
  const Reference& ref = reference();
  const StructureDb probe = read_structure_db((ref.dir / "shift_probe.dat").string());
  ASSERT_EQ(probe.num_chains(), 1u);
  EXPECT_FALSE(probe.has(StructureDbData::kDssp));
  const StructureChain chain = probe.chain(0);
  const json& expected = ref.values["shift_probe"];
  EXPECT_EQ(chain.sequence, expected["sequence"].get<std::string>());
  EXPECT_TRUE(chain.dssp.empty());
  EXPECT_TRUE(chain.phi_psi.empty());
  ASSERT_EQ(chain.backbone.size(), expected["backbone"].size());
  // Stored rounded to 0.01 Å: half a step, plus float rounding.
  const double difference = max_backbone_difference(chain.backbone, expected["backbone"]);
  std::cout << "max difference from the coordinates ProMod3 stored: " << difference << " Å\n";
  EXPECT_LE(difference, 0.0051);
  const std::string missing = testing::expected_error([&] { probe.sequence_profile(0); });
  EXPECT_NE(missing.find("shift_probe.dat stores no sequence profiles"), std::string::npos) << missing;
}

// Geometry the reader could get wrong (atom order, scale, shift, chain offsets): bond lengths of
// every residue, and peptide bonds between neighbours.
TEST(StructureDbTest, BackboneBondLengths) {
  const StructureDb& db = debian_db();
  struct Bond {
    const char* name;
    double ideal;
    size_t within = 0, total = 0;
    double sum = 0;
    void add(double length) {
      ++total;
      sum += length;
      within += std::abs(length - ideal) < 0.1;
    }
  };
  Bond n_ca{"N-CA", 1.46}, ca_c{"CA-C", 1.52}, c_o{"C-O", 1.23}, peptide{"C-N(next)", 1.33};
  size_t residues = 0;
  for (size_t i = 0; i < db.num_chains(); ++i) {
    const StructureChain chain = db.chain(i);
    residues += chain.backbone.size();
    for (size_t r = 0; r < chain.backbone.size(); ++r) {
      const BackboneResidue& b = chain.backbone[r];
      n_ca.add(distance(b.n, b.ca));
      ca_c.add(distance(b.ca, b.c));
      c_o.add(distance(b.c, b.o));
      if (r + 1 < chain.backbone.size()) peptide.add(distance(b.c, chain.backbone[r + 1].n));
    }
  }
  EXPECT_EQ(residues, db.num_residues());
  for (const Bond* bond : {&n_ca, &ca_c, &c_o, &peptide}) {
    const double fraction = double(bond->within) / bond->total;
    std::cout << bond->name << ": mean " << bond->sum / bond->total << " Å, " << 100 * fraction << "% of "
              << bond->total << " within 0.1 Å of " << bond->ideal << "\n";
    EXPECT_GE(fraction, 0.99) << bond->name;
  }
}

TEST(StructureDbTest, PartsReadAlone) {
  const StructureDb backbone_only = read_structure_db(kDebianStructureDb, {true, false, false});
  const StructureChain full = debian_db().chain(7);
  const StructureChain part = backbone_only.chain(7);
  EXPECT_EQ(part.sequence, full.sequence);
  EXPECT_TRUE(part.dssp.empty());
  EXPECT_TRUE(part.phi_psi.empty());
  ASSERT_EQ(part.backbone.size(), full.backbone.size());
  EXPECT_EQ(part.backbone.back().o, full.backbone.back().o);
  EXPECT_EQ(backbone_only.sequence_profile(7)[3], debian_db().sequence_profile(7)[3]);
}

TEST(StructureDbTest, TruncatedCopiesAreRefused) {
  const fs::path dir = testing::temp_dir("truncated");
  // Inside the header, the chain table and the backbone section.
  const std::pair<uint64_t, std::string> cuts[] = {
      {40, "expected type size"}, {5000, "expected chain 148's"}, {10000000, "expected the backbone section"}};
  for (const auto& [bytes, expected] : cuts) {
    const fs::path copy = dir / ("structure_db_" + std::to_string(bytes) + ".dat");
    write_prefix(kDebianStructureDb, copy, bytes);
    const std::string message = testing::expected_error([&] { read_structure_db(copy.string()); });
    EXPECT_NE(message.find(copy.string() + ": " + expected), std::string::npos) << message;
    EXPECT_NE(message.find("the file ends at byte " + std::to_string(bytes)), std::string::npos) << message;
  }
  const fs::path probe = reference().dir / "shift_probe.dat";
  const fs::path short_probe = dir / "short_probe.dat";
  write_prefix(probe, short_probe, fs::file_size(probe) - 1);
  const std::string message = testing::expected_error([&] { read_structure_db(short_probe.string()); });
  EXPECT_NE(message.find("the backbone section"), std::string::npos) << message;

  const fs::path long_probe = dir / "long_probe.dat";
  fs::copy_file(probe, long_probe);
  std::ofstream(long_probe, std::ios::binary | std::ios::app) << '\0';
  const std::string trailing = testing::expected_error([&] { read_structure_db(long_probe.string()); });
  EXPECT_NE(trailing.find(long_probe.string() + ": expected the end of the file"), std::string::npos) << trailing;
  fs::remove_all(dir);
}

TEST(StructureDbTest, ForeignAndMissingFilesAreRefused) {
  const fs::path dir = testing::temp_dir("foreign");
  const fs::path text = dir / "notes.txt";
  std::ofstream(text) << "not a structure database, but long enough to hold a header\n";
  const std::string foreign = testing::expected_error([&] { read_structure_db(text.string()); });
  EXPECT_NE(foreign.find(text.string() + ": expected magic number 1234 at byte 0"), std::string::npos) << foreign;

  const std::string missing = testing::expected_error([&] { read_structure_db((dir / "absent.dat").string()); });
  EXPECT_NE(missing.find("absent.dat: cannot open"), std::string::npos) << missing;

  const std::string out_of_range = testing::expected_error([&] { debian_db().chain(debian_db().num_chains()); });
  EXPECT_NE(out_of_range.find("no chain"), std::string::npos) << out_of_range;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kuafu::fold

// The manifest that seals a checkpoint folder: manifest.json lists each file with its size and CRC-32.
// Kept apart from checkpoint.cpp (and free of LibTorch) so that its parser is fuzzed on its own
// (fuzz/fuzz_checkpoint_manifest.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace kuafu::train {

inline constexpr const char* kManifestFile = "manifest.json";

// A manifest entry must name a plain file inside the checkpoint folder: nothing outside it is read.
bool plain_file_name(const std::string& name);

// The ranks sharing one verification: each reads the files dealt to `index` of `count` for their CRC-32
// (sizes and presence are checked by all), so a checkpoint is read once in all instead of once per rank.
struct CrcShare {
  int index = 0;
  int count = 1;
};

// Which share checks each file of `files` (a manifest's "files" table, in its order): the largest file
// first, each to the share with the fewest bytes so far (ties: the lowest index). The same on every rank.
std::vector<int> crc_checkers(const nlohmann::json& files, int count);

// Verifies that every file the manifest of `folder` lists is present with its size and, when `share`
// deals it to this caller, its CRC-32, and returns the manifest; kuafu::Error naming the folder, the
// manifest or the file otherwise.
nlohmann::json verify_manifest(const std::string& folder, CrcShare share = {});

}  // namespace kuafu::train

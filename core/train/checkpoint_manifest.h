// The manifest that seals a checkpoint folder: manifest.json lists each file with its size and CRC-32.
// Kept apart from checkpoint.cpp (and free of LibTorch) so that its parser is fuzzed on its own
// (fuzz/fuzz_checkpoint_manifest.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kuafu::train {

inline constexpr const char* kManifestFile = "manifest.json";

// A manifest entry must name a plain file inside the checkpoint folder: nothing outside it is read.
bool plain_file_name(const std::string& name);

// Verifies that every file the manifest of `folder` lists is present with its size and CRC-32 and
// returns the manifest; kuafu::Error naming the folder, the manifest or the file otherwise.
nlohmann::json verify_manifest(const std::string& folder);

}  // namespace kuafu::train

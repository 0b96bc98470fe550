#include "core/train/checkpoint_manifest.h"

#include <algorithm>
#include <filesystem>

#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace kuafu::train {
namespace fs = std::filesystem;

bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
}

std::vector<int> crc_checkers(const nlohmann::json& files, int count) {
  std::vector<std::pair<uint64_t, size_t>> by_size;  // (bytes, position), largest first
  size_t position = 0;
  for (const auto& [name, entry] : files.items()) {
    const bool sized = entry.is_object() && entry.contains("bytes") && entry.at("bytes").is_number_unsigned();
    by_size.emplace_back(sized ? entry.at("bytes").get<uint64_t>() : 0, position++);
  }
  std::stable_sort(by_size.begin(), by_size.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int> checker(by_size.size(), 0);
  std::vector<uint64_t> load(static_cast<size_t>(std::max(count, 1)), 0);
  for (const auto& [bytes, at] : by_size) {
    const auto least = std::min_element(load.begin(), load.end());
    checker[at] = static_cast<int>(least - load.begin());
    *least += bytes;
  }
  return checker;
}

nlohmann::json verify_manifest(const std::string& folder, CrcShare share) {
  KUAFU_CHECK(share.count >= 1 && share.index >= 0 && share.index < share.count, "a CRC share is index ", share.index,
              " of ", share.count);
  const fs::path manifest_path = fs::path(folder) / kManifestFile;
  KUAFU_CHECK(fs::exists(folder), "checkpoint ", folder, " does not exist");
  KUAFU_CHECK(fs::exists(manifest_path), "checkpoint ", folder, " has no ", kManifestFile,
              ": it is incomplete or not a Kuafu checkpoint");
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_file(manifest_path.string()));
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint manifest " + manifest_path.string() + " is corrupt: " + e.what());
  }
  KUAFU_CHECK(manifest.is_object() && manifest.contains("files") && manifest.at("files").is_object(), "checkpoint manifest ",
              manifest_path.string(), " has no \"files\" table");
  const std::vector<int> checkers = crc_checkers(manifest.at("files"), share.count);
  size_t position = 0;
  for (const auto& [name, entry] : manifest.at("files").items()) {
    const bool mine = checkers[position++] == share.index;
    KUAFU_CHECK(plain_file_name(name), "checkpoint manifest ", manifest_path.string(), " lists \"",
                name.substr(0, 80), name.size() > 80 ? "...\"" : "\"",
                ", which is not a plain file name inside the checkpoint folder; refusing to read it");
    const fs::path file = fs::path(folder) / name;
    KUAFU_CHECK(fs::exists(fs::symlink_status(file)), "checkpoint ", folder, " is missing ", name, ", which ",
                manifest_path.string(), " lists");
    KUAFU_CHECK(fs::is_regular_file(fs::symlink_status(file)), "checkpoint file ", file.string(),
                " is not a regular file (a link or a folder); refusing to read it");
    KUAFU_CHECK(entry.is_object() && entry.contains("bytes") && entry.at("bytes").is_number_unsigned() &&
                    entry.contains("crc32") && entry.at("crc32").is_number_unsigned(),
                "checkpoint manifest ", manifest_path.string(), ": the entry of ", name,
                " needs whole numbers \"bytes\" and \"crc32\"");
    const auto size = static_cast<uint64_t>(fs::file_size(file));
    const auto expected = entry.at("bytes").get<uint64_t>();
    KUAFU_CHECK(size == expected, "checkpoint file ", file.string(), " has ", size, " bytes but the manifest says ",
                expected, " (truncated or overwritten); refusing to load it");
    if (!mine) continue;
    const auto crc = file_crc32(file.string());
    KUAFU_CHECK(crc == entry.at("crc32").get<uint32_t>(), "checkpoint file ", file.string(),
                " fails its CRC-32 check (corrupt); refusing to load it");
  }
  return manifest;
}

}  // namespace kuafu::train

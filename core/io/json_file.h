// JSON files read whole, with errors that name the file: configs, indexes, tokenizer files.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace kuafu::io {

// The file parsed; kuafu::Error naming `path` when it is missing, unreadable or not valid JSON.
inline nlohmann::json read_json_file(const std::string& path) {
  KUAFU_CHECK(std::filesystem::exists(path), path, " does not exist");
  try {
    return nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path + ": not valid JSON: " + e.what());
  }
}

// The same, required to hold one JSON object (a config, an index).
inline nlohmann::json read_json_object(const std::string& path) {
  nlohmann::json json = read_json_file(path);
  KUAFU_CHECK(json.is_object(), path, " is not a JSON object");
  return json;
}

}  // namespace kuafu::io

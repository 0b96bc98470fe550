// The JSON line a command prints last (benchmark lines, Python references, eval lines), found among
// whatever else it printed before it, and the last line of a JSON-lines file that has a given key.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kuafu::testing {

// The last line of `output` that parses as a JSON object; null when there is none.
inline nlohmann::json last_json_line(const std::string& output) {
  nlohmann::json found;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] == '{') {
      nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded()) found = std::move(parsed);
    }
  }
  return found;
}

// The last line of the JSON-lines file `path` that has `key` (a run's last evaluation in its metrics.jsonl:
// "val_loss"); null when there is none.
inline nlohmann::json last_line_with(const std::filesystem::path& path, const std::string& key) {
  nlohmann::json found;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains(key)) found = std::move(row);
  }
  return found;
}

}  // namespace kuafu::testing

// The JSON line a command prints last (benchmark lines, Python references, eval lines), found among
// whatever else it printed before it.
#pragma once

#include <nlohmann/json.hpp>

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

}  // namespace kuafu::testing

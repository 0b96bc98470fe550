// Small string helpers shared by the config and command-line layers.
#include "core/util/text.h"

#include <algorithm>
#include <numeric>

namespace kuafu::text {

size_t edit_distance(std::string_view a, std::string_view b) {
  return edit_distance(a, b, std::max(a.size(), b.size()));  // never more than the longer length
}

size_t edit_distance(std::string_view a, std::string_view b, size_t limit) {
  // Each edit changes the length by at most one.
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return limit + 1;
  // One row of the dynamic-programming table at a time: row[j] = distance(a[0..i), b[0..j)).
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];  // distance(a[0..i-1), b[0..j-1))
    row[0] = i;
    size_t row_min = row[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      row_min = std::min(row_min, row[j]);
      diagonal = above;
    }
    // Row minima never decrease, so the distance is already beyond the limit.
    if (row_min > limit) return limit + 1;
  }
  return std::min(row[b.size()], limit + 1);
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates,
                          size_t max_distance) {
  std::string best;
  size_t best_distance = max_distance + 1;
  for (const auto& candidate : candidates) {
    if (best_distance == 0) break;  // an exact match: nothing is nearer
    const size_t d = edit_distance(word, candidate, best_distance - 1);
    if (d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

std::string abbreviate(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t cut = max_bytes;
  // Cut before a UTF-8 continuation byte, not inside a character.
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut)) + "... (" + std::to_string(s.size()) + " bytes)";
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    if (end == std::string_view::npos) {
      parts.emplace_back(s.substr(start));
      return parts;
    }
    parts.emplace_back(s.substr(start, end - start));
    start = end + 1;
  }
}

std::string trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\n\f\v";
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return "";
  const size_t last = s.find_last_not_of(kSpace);
  return std::string(s.substr(first, last - first + 1));
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace kuafu::text

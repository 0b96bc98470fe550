// Small string helpers shared by the config and command-line layers: splitting, trimming, joining,
// and "did you mean" suggestions by edit distance.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kuafu::text {

// Levenshtein distance: the fewest single-character insertions, deletions or substitutions.
size_t edit_distance(std::string_view a, std::string_view b);
// The same, computed only as far as `limit`: the distance if it is at most `limit`, else limit + 1.
// Words whose lengths differ by more than `limit` cost nothing, so a huge word is cheap to compare.
size_t edit_distance(std::string_view a, std::string_view b, size_t limit);

// The candidate nearest to `word` within `max_distance` edits (the first one on ties), or "" if none.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates,
                          size_t max_distance);

// `s` itself when it has at most `max_bytes` bytes, else its first `max_bytes` (whole UTF-8
// characters), "..." and its length: "abc... (6 bytes)". For echoing user text, which may be huge.
std::string abbreviate(std::string_view s, size_t max_bytes = 100);

// split("a.b..c", '.') == {"a", "b", "", "c"}; split("", '.') == {""}.
std::vector<std::string> split(std::string_view s, char sep);

// Removes leading and trailing whitespace (space, tab, CR, LF, FF, VT).
std::string trim(std::string_view s);

std::string join(const std::vector<std::string>& parts, std::string_view sep);

bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);

}  // namespace kuafu::text

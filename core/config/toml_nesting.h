// TOML nesting, bounded before parsing: a table header or key of thousands of dotted parts (or as many
// nested brackets) would overflow the stack in the recursive walk of the parsed tree and in toml++
// itself, so the loader scans the text's shape first and refuses what nests too deep.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kuafu::config {

// The deepest nesting a config may have, counted from the root: table-header parts, dotted-key parts,
// arrays and inline tables. Real configs use a handful.
inline constexpr size_t kMaxNesting = 64;

struct TooDeep {
  uint32_t line;  // 1-based
  size_t depth;
};

// The first place in `text` that nests deeper than kMaxNesting, if any. Only the text's shape is read
// (headers, keys, brackets, strings, comments); what is not TOML is skipped for the parser to report.
std::optional<TooDeep> find_too_deep(std::string_view text);

// "nesting too deep: expected at most 64 levels ..., found `depth`".
std::string nesting_problem(size_t depth);

}  // namespace kuafu::config

// What the structure and alignment readers share to read text files: the file (gunzipped), strict
// numbers, and errors as "file:line: message".
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kuafu::fold {

// The whole file as text, gunzipped when its name ends in ".gz" (Debian ships its examples so);
// kuafu::Error naming the path when it cannot be read.
std::string read_text_file(const std::string& path);

// "file:line: message" as a kuafu::Error; strict numbers (the whole field, no "nan"/"inf", surrounding
// blanks allowed), nullopt for anything else.
[[noreturn]] void fail_at_line(const std::string& file, size_t line, const std::string& message);
std::optional<double> parse_decimal(std::string_view field);
std::optional<int> parse_integer(std::string_view field);

// `s` without leading and trailing blanks (space, tab, CR, LF); a view into `s`.
std::string_view trim_field(std::string_view s);
std::string upper_case(std::string_view s);

}  // namespace kuafu::fold

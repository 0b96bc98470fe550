#include "apps/fastfold/text_fields.h"

#include <zlib.h>

#include <cctype>
#include <charconv>
#include <cmath>

#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::fold {

std::string_view trim_field(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

std::string upper_case(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

void fail_at_line(const std::string& file, size_t line, const std::string& message) {
  throw Error(detail::concat(file, ":", line, ": ", message));
}

std::optional<double> parse_decimal(std::string_view field) {
  field = trim_field(field);
  if (!field.empty() && field[0] == '+') field.remove_prefix(1);
  if (field.empty() || field.find_first_not_of("0123456789+-.eE") != std::string_view::npos) return std::nullopt;
  double value = 0;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (error != std::errc() || end != field.data() + field.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<int> parse_integer(std::string_view field) {
  field = trim_field(field);
  if (!field.empty() && field[0] == '+') field.remove_prefix(1);
  int value = 0;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (field.empty() || error != std::errc() || end != field.data() + field.size()) return std::nullopt;
  return value;
}

std::string read_text_file(const std::string& path) {
  if (!text::ends_with(path, ".gz")) return read_file(path);
  gzFile in = gzopen(path.c_str(), "rb");
  KUAFU_CHECK(in != nullptr, "cannot open ", path);
  std::string text;
  char buffer[1 << 16];
  int n = 0;
  while ((n = gzread(in, buffer, sizeof buffer)) > 0) text.append(buffer, size_t(n));
  int status = Z_OK;
  const std::string error = n < 0 ? gzerror(in, &status) : "";
  gzclose(in);
  KUAFU_CHECK(n == 0, path, ": cannot decompress: ", error, " (after ", text.size(), " bytes)");
  return text;
}

}  // namespace kuafu::fold

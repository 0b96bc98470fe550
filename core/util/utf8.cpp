#include "core/util/utf8.h"

namespace kuafu::text {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The bytes a character starting with `lead` takes, and the range its second byte must lie in (the
// others lie in 0x80-0xBF); 0 for a byte that starts no character.
struct Lead {
  size_t length;
  unsigned char second_min, second_max;
};
Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};  // no overlong forms
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};  // no overlong forms
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0, 0, 0};
}

// How many bytes from `i` belong to a well-formed prefix of the character starting there (its whole
// length when complete).
size_t valid_prefix(std::string_view bytes, size_t i, const Lead& lead) {
  size_t k = 1;
  for (; k < lead.length && i + k < bytes.size(); ++k) {
    const auto b = static_cast<unsigned char>(bytes[i + k]);
    const unsigned char low = k == 1 ? lead.second_min : 0x80, high = k == 1 ? lead.second_max : 0xBF;
    if (b < low || b > high) break;
  }
  return k;
}

}  // namespace

std::string replace_invalid_utf8(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Lead lead = lead_of(static_cast<unsigned char>(bytes[i]));
    if (lead.length == 0) {  // a byte no character starts with
      out += kReplacement;
      ++i;
      continue;
    }
    const size_t valid = valid_prefix(bytes, i, lead);
    if (valid == lead.length) {
      out.append(bytes, i, valid);
    } else {
      out += kReplacement;  // the maximal ill-formed subpart; the next byte starts afresh
    }
    i += valid;
  }
  return out;
}

size_t complete_utf8_prefix(const std::string& bytes) {
  // A character is at most 4 bytes: look for its lead among the last 3.
  for (size_t back = 1; back <= 3 && back <= bytes.size(); ++back) {
    const size_t i = bytes.size() - back;
    const Lead lead = lead_of(static_cast<unsigned char>(bytes[i]));
    if (lead.length == 0) continue;  // a continuation byte (or an invalid one): look further back
    const bool incomplete = lead.length > back && valid_prefix(bytes, i, lead) == back;
    return incomplete ? i : bytes.size();
  }
  return bytes.size();
}

std::string Utf8Stream::next(const std::string& bytes) {
  const size_t whole = complete_utf8_prefix(bytes);
  if (whole <= given_) return {};
  std::string piece = replace_invalid_utf8(bytes.substr(given_, whole - given_));
  given_ = whole;
  return piece;
}

std::string Utf8Stream::finish(const std::string& bytes) {
  if (bytes.size() <= given_) return {};
  std::string piece = replace_invalid_utf8(bytes.substr(given_));
  given_ = bytes.size();
  return piece;
}

std::optional<size_t> first_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Lead lead = lead_of(static_cast<unsigned char>(s[i]));
    if (lead.length == 0 || valid_prefix(s, i, lead) != lead.length) return i;
    i += lead.length;
  }
  return std::nullopt;
}

size_t utf8_length(char lead) {
  const auto c = static_cast<unsigned char>(lead);
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
}

}  // namespace kuafu::text

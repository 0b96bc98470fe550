// Text as it can be printed: a byte-level tokenizer may end a sample, or a streamed piece, inside a
// UTF-8 character, and JSON output refuses such bytes.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kuafu::text {

// The offset of the first byte that does not belong to valid UTF-8 (overlong forms, surrogates and code
// points past U+10FFFF included), if any.
std::optional<size_t> first_invalid_utf8(std::string_view s);
// The length in bytes of the UTF-8 character that starts with byte `lead` (text already checked valid).
size_t utf8_length(char lead);

// `bytes` with every invalid or incomplete UTF-8 sequence replaced by U+FFFD, one per maximal
// ill-formed subpart (the Unicode standard's practice, which Python's bytes.decode("utf-8",
// errors="replace") and so transformers' decode follow).
std::string replace_invalid_utf8(const std::string& bytes);

// The length of `bytes` without a trailing character that is incomplete but could still be completed
// (a stream holds it back until its remaining bytes arrive).
size_t complete_utf8_prefix(const std::string& bytes);

// A growing text (a streamed answer, its tokens decoded again as each arrives) handed out in whole
// characters: each call gives what is new since the last, invalid bytes as U+FFFD.
class Utf8Stream {
 public:
  // The new bytes of `bytes` up to its last complete character (one still being completed waits).
  std::string next(const std::string& bytes);
  // Everything of `bytes` not yet given, the end of the stream.
  std::string finish(const std::string& bytes);
  bool started() const { return given_ > 0; }

 private:
  size_t given_ = 0;
};

}  // namespace kuafu::text

// Invalid and incomplete UTF-8 against results worked by hand from the Unicode standard's rule (one
// U+FFFD per maximal ill-formed subpart, Table 3-8), which Python's bytes.decode("utf-8", "replace")
// follows; e.g. b"\xe2\x28\xa1".decode("utf-8", "replace") == "\ufffd(\ufffd".
#include "core/util/utf8.h"

#include <gtest/gtest.h>

namespace kuafu::text {
namespace {

const std::string kR = "\xEF\xBF\xBD";  // U+FFFD

TEST(Utf8Test, ValidTextIsKept) {
  for (const std::string s : {"", "plain", "caf\xC3\xA9", "\xE2\x82\xAC 5", "\xF0\x9F\x98\x80!"}) {
    EXPECT_EQ(replace_invalid_utf8(s), s);
    EXPECT_EQ(complete_utf8_prefix(s), s.size());
  }
}

TEST(Utf8Test, EachMaximalIllFormedSubpartBecomesOneReplacement) {
  // A sample cut inside a character (byte-level BPE does this): one replacement for the start.
  EXPECT_EQ(replace_invalid_utf8("caf\xC3"), "caf" + kR);
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82"), kR);
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98"), kR);
  // A lead byte followed by what cannot continue it: the next byte starts afresh.
  EXPECT_EQ(replace_invalid_utf8("\xE2\x28\xA1"), kR + "(" + kR);
  EXPECT_EQ(replace_invalid_utf8("\xC3(x"), kR + "(x");
  // Bytes no character starts with, overlong forms, surrogates and code points above U+10FFFF: one
  // replacement per byte (Table 3-8's examples).
  EXPECT_EQ(replace_invalid_utf8("\xFF"), kR);
  EXPECT_EQ(replace_invalid_utf8("\x80\xBF"), kR + kR);
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), kR + kR);
  EXPECT_EQ(replace_invalid_utf8("\xE0\x80\xAF"), kR + kR + kR);
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), kR + kR + kR);
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), kR + kR + kR + kR);
  EXPECT_EQ(replace_invalid_utf8("\xF5\x80"), kR + kR);
  // Table 3-8 itself: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d.
  EXPECT_EQ(replace_invalid_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + kR + kR + kR + "b" + kR + "c" + kR + kR + "d");
}

TEST(Utf8Test, AStreamHoldsBackOnlyACharacterThatCanStillBeCompleted) {
  EXPECT_EQ(complete_utf8_prefix("caf\xC3"), 3u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xF0"), 2u);
  // Nothing can complete these: they are printed (as replacements) rather than held.
  EXPECT_EQ(complete_utf8_prefix("ab\xFF"), 3u);
  EXPECT_EQ(complete_utf8_prefix("ab\xE2\x28"), 4u);
  EXPECT_EQ(complete_utf8_prefix("ab\xED\xA0"), 4u);
}

// A text growing as tokens arrive, worked by hand: "é" (C3 A9) arrives in two calls and is given once
// whole; an impossible byte is given as U+FFFD; the end gives an unfinished character as U+FFFD.
TEST(Utf8Test, AStreamGivesEachWholeCharacterOnce) {
  Utf8Stream stream;
  EXPECT_FALSE(stream.started());
  EXPECT_EQ(stream.next("caf\xC3"), "caf");
  EXPECT_EQ(stream.next("caf\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(stream.next("caf\xC3\xA9"), "");
  EXPECT_EQ(stream.next("caf\xC3\xA9\xFF!"), "\xEF\xBF\xBD!");
  EXPECT_EQ(stream.finish("caf\xC3\xA9\xFF!\xE2\x82"), "\xEF\xBF\xBD");
  EXPECT_TRUE(stream.started());
}

}  // namespace
}  // namespace kuafu::text

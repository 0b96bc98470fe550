// The emoji data recipe (`kuafu-sd prepare`, prepare.recipe = "emoji"): Debian's ruby-tanuki-emoji
// ships Noto's emoji as 72×72 RGBA PNGs (emoji_u<code points>.png) and their Unicode names
// (vendor/emojione-alpha-codes/eac.json: "1f44b-1f3fd" -> "waving hand: medium skin tone"). Each emoji
// becomes an RGB image composited onto white, captioned with its name, in an image folder
// <split>/<base code points>/<file>.png + .txt. Held out for evaluation: for every base that comes in
// the five skin tones, one tone (the i-th such base, by code points, holds out tone i mod 5: a Latin
// square), so the evaluation captions ask for (emoji, tone) pairs never trained on while every emoji
// and every tone are.
#pragma once

#include <cstdint>
#include <string>

namespace kuafu::sd {

struct EmojiSplit {
  int64_t train = 0, held_out = 0;  // images written to each folder
  int64_t toned_bases = 0;          // bases found in all five tones
  int64_t unnamed = 0;              // images skipped: no name in the index (flags by region code, ...)
};

// Writes the new folders `train_dir` and `held_out_dir` (existing ones are refused) from the package's
// gem folder `package` (…/gems/tanuki_emoji-<version>). kuafu::Error naming the file that is missing or
// unreadable.
EmojiSplit write_emoji_folders(const std::string& package, const std::string& train_dir, const std::string& held_out_dir);

// The skin tone (0 light .. 4 dark) of a code point sequence's modifier U+1F3FB .. U+1F3FF, or -1.
int skin_tone_of(const std::string& code_points);

}  // namespace kuafu::sd

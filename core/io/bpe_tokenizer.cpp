#include "core/io/bpe_tokenizer.h"

#include <nlohmann/json.hpp>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include "core/io/json_file.h"
#include "core/io/sentencepiece_model.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/text.h"
#include "core/util/utf8.h"

namespace kuafu::io {
namespace fs = std::filesystem;

namespace {

// GPT-2's pre-tokenisation pattern, as Hugging Face's ByteLevel pre-tokenizer uses it.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// CLIP's words (its tokenizer's Split pre-tokenizer, matches kept, whitespace between them dropped).
constexpr const char* kClipWordPattern =
    R"(<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+)";

std::unique_ptr<icu::RegexPattern> compile(const char* pattern) {
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexPattern> compiled(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, status));
  KUAFU_CHECK(U_SUCCESS(status), "ICU could not compile the pre-tokenisation pattern ", pattern, ": ", u_errorName(status));
  return compiled;
}

// Calls `piece` with each match of `pattern` in `text` (UTF-8) and, with `gaps`, with each stretch of
// text between matches too, in order (tokenizers' Split with behavior "Isolated").
void for_each_match(const icu::RegexPattern& pattern, const std::string& text, const std::function<void(const std::string&)>& piece,
                    bool gaps = false) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString unicode = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  std::unique_ptr<icu::RegexMatcher> matcher(pattern.matcher(unicode, status));
  KUAFU_CHECK(U_SUCCESS(status), "ICU regex: ", u_errorName(status));
  std::string found;
  auto emit = [&](int32_t start, int32_t end) {
    if (start >= end) return;
    found.clear();
    unicode.tempSubStringBetween(start, end).toUTF8String(found);
    piece(found);
  };
  int32_t previous = 0;
  while (matcher->find(status) && U_SUCCESS(status)) {
    const int32_t start = matcher->start(status), end = matcher->end(status);
    if (gaps) emit(previous, start);
    emit(start, end);
    previous = end;
  }
  KUAFU_CHECK(U_SUCCESS(status), "ICU regex: ", u_errorName(status));
  if (gaps) emit(previous, unicode.length());
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Every `from` in `text` replaced by `to`, in one pass (a whole text may have a million spaces).
std::string replace_all(const std::string& text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  std::string out;
  out.reserve(text.size());
  size_t begin = 0;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, begin)) {
    out.append(text, begin, at - begin).append(to);
    begin = at + from.size();
  }
  return out.append(text, begin, std::string::npos);
}

// How many bytes of whitespace (Unicode White_Space, as Rust's char::is_whitespace, which tokenizers'
// lstrip and rstrip use) `s` begins with, or ends with.
size_t leading_whitespace(std::string_view s) {
  int32_t at = 0;
  const auto length = static_cast<int32_t>(s.size());
  while (at < length) {
    int32_t next = at;
    UChar32 c;
    U8_NEXT(s.data(), next, length, c);
    if (c < 0 || !u_isUWhiteSpace(c)) break;
    at = next;
  }
  return static_cast<size_t>(at);
}
size_t trailing_whitespace(std::string_view s) {
  auto at = static_cast<int32_t>(s.size());
  while (at > 0) {
    int32_t before = at;
    UChar32 c;
    U8_PREV(s.data(), 0, before, c);
    if (c < 0 || !u_isUWhiteSpace(c)) break;
    at = before;
  }
  return s.size() - static_cast<size_t>(at);
}

// SentencePiece's token for one byte: "<0x0A>".
std::string byte_token(uint8_t byte) {
  static const char* const kHex = "0123456789ABCDEF";
  return std::string("<0x") + kHex[byte >> 4] + kHex[byte & 0xF] + ">";
}

// The byte a "<0xNN>" token stands for, if `token` is one (as tokenizers' ByteFallback decoder reads it).
std::optional<uint8_t> byte_of_token(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  auto digit = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  // Rust's from_str_radix, which tokenizers parses with, takes a leading '+': "<0x+F>" is byte 15 there too.
  const int high = token[3] == '+' ? 0 : digit(token[3]), low = digit(token[4]);
  if (high < 0 || low < 0) return std::nullopt;
  return static_cast<uint8_t>(high * 16 + low);
}

// SentencePiece's mark for a space, "▁" (U+2581).
constexpr const char* kSpaceMark = "\xE2\x96\x81";

}  // namespace

struct BpeTokenizer::State {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> tokens;                 // id -> token (byte-level characters, or as it is)
  std::unordered_map<std::string, int> merge_rank;  // "left right" -> rank
  std::vector<int64_t> merge_result;                // rank -> the id of the token the merge makes
  std::vector<std::pair<std::string, int64_t>> special;  // matched whole, longest first
  std::string byte_symbol[256];                    // byte -> its printable character, as UTF-8
  std::unordered_map<uint32_t, uint8_t> symbol_byte;
  bool add_prefix_space = false;
  // tokenizer.json's normalizer as steps applied in order to the text between special tokens
  // (CollapseWhitespace: every run of whitespace one space, CLIP's; Prepend `text` to a text that is not
  // empty and Replace every `text` by `replacement`: Llama 2's "▁" before the text and for each space).
  enum class Normalize { Lowercase, Nfc, Nfd, Nfkc, Nfkd, CollapseWhitespace, Prepend, Replace };
  struct NormalizeStep {
    Normalize kind;
    std::string text{}, replacement{};
    bool operator==(const NormalizeStep& o) const {
      return std::tie(kind, text, replacement) == std::tie(o.kind, o.text, o.replacement);
    }
  };
  std::vector<NormalizeStep> normalizers;
  std::string normalized(const std::string& text) const;
  std::unique_ptr<icu::RegexPattern> pattern;
  // A Split pre-tokenizer before the byte-level one: text cut into words by word_pattern first. CLIP's
  // keeps only the matches (behavior "Removed") and ends each word's last symbol in word_end ("</w>"), a
  // symbol the vocabulary lacks read as `unknown`; Llama 3's and Qwen's keep the text between matches as
  // pieces of their own (behavior "Isolated": keep_gaps).
  std::unique_ptr<icu::RegexPattern> word_pattern;
  std::string word_pattern_text;
  bool keep_gaps = false;
  // ByteLevel's use_regex: each piece cut further by GPT-2's pattern (off after a Split that already cut).
  bool byte_level_regex = true;
  // BPE's ignore_merges (Llama 3): a piece that is a token of its own is taken whole, whatever the merges.
  bool ignore_merges = false;
  std::string word_end;
  std::optional<int64_t> unknown;

  // SentencePiece's BPE as Llama 2's, Mistral's and TinyLlama's tokenizer.json hold it, instead of the
  // byte-level one: a piece's symbols are its characters (with "▁" for each space); a character the
  // vocabulary lacks is spelt by its UTF-8 bytes' tokens "<0xNN>" (byte_fallback), else read as `unknown`
  // (a run of them as one with fuse_unknown).
  bool characters = false;
  bool byte_fallback = false;
  bool fuse_unknown = false;
  // Where a Metaspace puts a "▁" before a stretch of text that has none: nowhere, before the text's first
  // stretch only (not after a special token), before every stretch.
  enum class Prepend { Never, First, Always };
  // The Metaspace pre-tokenizer: each space becomes `replacement`, one is put first as `prepend` says, and
  // with `split` each replacement starts a piece of its own (else the stretch is one piece).
  struct Metaspace {
    std::string replacement;
    Prepend prepend;
    bool split;
    bool operator==(const Metaspace& o) const {
      return std::tie(replacement, prepend, split) == std::tie(o.replacement, o.prepend, o.split);
    }
  };
  std::optional<Metaspace> metaspace;
  // The decoder of a SentencePiece file, steps applied in order to the tokens' texts, which are then
  // joined (tokenizers' decode_chain): Replace `text` by `replacement` in each; ByteFallback (runs of
  // "<0xNN>" tokens to their bytes, "\uFFFD" a byte if they are no UTF-8); Fuse (all one text); Strip (up to
  // `start` leading and `stop` trailing `text`s of each); Metaspace (`text` a space, dropped from the first
  // token unless `prepend` is Never).
  enum class Decode { Replace, ByteFallback, Fuse, Strip, Metaspace };
  struct DecodeStep {
    Decode kind;
    std::string text{}, replacement{};
    int64_t start = 0, stop = 0;
    Prepend prepend = Prepend::Always;
    bool operator==(const DecodeStep& o) const {
      return std::tie(kind, text, replacement, start, stop, prepend) ==
             std::tie(o.kind, o.text, o.replacement, o.start, o.stop, o.prepend);
    }
  };
  std::vector<DecodeStep> decoder;

  // What transformers' tokenizer(text) puts around a text's ids (a tokenizer.json's post_processor, or
  // tokenizer_config.json's add_bos_token / add_eos_token where there is no tokenizer.json).
  std::vector<int64_t> added_before, added_after;
  // Added tokens that take the whitespace before (lstrip) or after (rstrip) them with them, so that it
  // reaches no other token (tokenizers' AddedToken options).
  std::set<int64_t> strips_left, strips_right;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;  // piece -> ids

  State() {
    // GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256, 257, ...
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? b : next++;
      append_utf8(byte_symbol[b], cp);
      symbol_byte[cp] = static_cast<uint8_t>(b);
    }
    pattern = compile(kPattern);
  }

  // How many tokens the file being read lists: ids may leave holes, but at most kMaxIdGap past that count,
  // so that the id -> token table follows the file (an id of 2^31 - 1 in a one-token vocab.json asked for
  // 64 GiB; found by fuzz_bpe_files).
  static constexpr int64_t kMaxIdGap = 65536;
  int64_t listed_tokens = 0;

  void add_token(const std::string& token, int64_t id, const std::string& where) {
    KUAFU_CHECK(id >= 0 && id < (int64_t{1} << 31), where, ": token '", text::abbreviate(token), "' has id ", id);
    KUAFU_CHECK(id < listed_tokens + kMaxIdGap, where, ": token '", text::abbreviate(token), "' has id ", id,
                ", more than ", kMaxIdGap, " past the ", listed_tokens, " tokens the file lists");
    const auto [it, inserted] = vocab.emplace(token, id);
    KUAFU_CHECK(inserted || it->second == id, where, ": token '", text::abbreviate(token), "' has two ids, ", it->second,
                " and ", id);
    if (tokens.size() <= static_cast<size_t>(id)) tokens.resize(static_cast<size_t>(id) + 1);
    // Two tokens of one id would decode as whichever came last (found by fuzz_bpe_files).
    std::string& holder = tokens[static_cast<size_t>(id)];
    KUAFU_CHECK(holder.empty() || holder == token, where, ": id ", id, " is given to both '", text::abbreviate(holder),
                "' and '", text::abbreviate(token), "' (decoding it would be ambiguous)");
    holder = token;
  }

  void add_merge(const std::string& left, const std::string& right, const std::string& where) {
    KUAFU_CHECK(!left.empty() && !right.empty(), where, ": a merge needs two symbols");
    KUAFU_CHECK(vocab.count(left + right), where, ": the merge of '", text::abbreviate(left), "' and '",
                text::abbreviate(right), "' makes a token the vocabulary lacks");
    if (merge_rank.emplace(left + " " + right, static_cast<int>(merge_rank.size())).second) {
      merge_result.push_back(vocab.at(left + right));
    }
  }

  // A token named twice (by two files, or as a piece's type and by name) is matched once.
  void add_special(const std::string& token, const std::string& where) {
    const auto found = vocab.find(token);
    KUAFU_CHECK(found != vocab.end(), where, ": special token '", text::abbreviate(token), "' is not in the vocabulary");
    if (std::any_of(special.begin(), special.end(), [&](const auto& s) { return s.first == token; })) return;
    special.emplace_back(token, found->second);
    std::sort(special.begin(), special.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }

  // A byte-level piece's symbols: each byte's printable character, the last one ending in word_end.
  std::vector<std::string> byte_symbols(const std::string& piece) const {
    std::vector<std::string> symbols;
    for (unsigned char b : piece) symbols.push_back(byte_symbol[b]);
    if (!symbols.empty()) symbols.back() += word_end;
    return symbols;
  }

  // A SentencePiece piece's symbols: its characters, one the vocabulary lacks spelt by its bytes' tokens
  // or read as the unknown token (a run of such characters as one with fuse_unknown), as tokenizers' BPE
  // model does before merging.
  std::vector<std::string> character_symbols(const std::string& piece) const {
    std::vector<std::string> symbols;
    bool after_unknown = false;
    for (size_t at = 0; at < piece.size();) {
      const std::string character = piece.substr(at, text::utf8_length(piece[at]));
      at += character.size();
      const bool known = vocab.count(character) > 0;
      if (!known && !byte_fallback) {
        KUAFU_CHECK(unknown, "BPE: the character '", character,
                    "' is not in the vocabulary, which has neither an unk_token nor byte_fallback");
        if (!(after_unknown && fuse_unknown)) symbols.push_back(tokens[static_cast<size_t>(*unknown)]);
        after_unknown = true;
        continue;
      }
      if (known) {
        symbols.push_back(character);
      } else {  // every "<0xNN>" is in the vocabulary (checked on reading)
        for (unsigned char b : character) symbols.push_back(byte_token(b));
      }
      after_unknown = false;
    }
    return symbols;
  }

  // Merges adjacent symbols as tokenizers' BPE does: the pair of lowest rank first (the leftmost among
  // equals), each merge offering new pairs with its neighbours, until no pair has a rank. The queue keeps
  // a long piece (a SentencePiece file without a pre-tokenizer reads the whole text as one) near linear.
  void merge(std::vector<std::string>& symbols) const {
    struct Pair {
      int rank;
      size_t left;
      bool operator>(const Pair& o) const { return std::tie(rank, left) > std::tie(o.rank, o.left); }
    };
    const size_t none = symbols.size();
    std::vector<size_t> next(symbols.size()), previous(symbols.size());  // the symbols still there, in order
    for (size_t i = 0; i < symbols.size(); ++i) next[i] = i + 1, previous[i] = i == 0 ? none : i - 1;
    std::vector<bool> gone(symbols.size(), false);
    std::priority_queue<Pair, std::vector<Pair>, std::greater<Pair>> queue;
    std::string key;
    auto rank_at = [&](size_t left) {  // of the pair that starts at `left` now; -1: none
      if (left == none || next[left] == none) return -1;
      key.assign(symbols[left]).append(" ").append(symbols[next[left]]);
      const auto rank = merge_rank.find(key);
      return rank == merge_rank.end() ? -1 : rank->second;
    };
    auto offer = [&](size_t left) {
      if (const int rank = rank_at(left); rank >= 0) queue.push({rank, left});
    };
    for (size_t i = 0; i + 1 < symbols.size(); ++i) offer(i);
    while (!queue.empty()) {
      const Pair pair = queue.top();
      queue.pop();
      // Queued before a neighbouring merge changed its symbols: taken only if what is there now makes the
      // same token (as tokenizers checks), else what is there now was queued on its own.
      if (gone[pair.left]) continue;
      const int now = rank_at(pair.left);
      if (now < 0 || merge_result[static_cast<size_t>(now)] != merge_result[static_cast<size_t>(pair.rank)]) continue;
      const size_t right = next[pair.left];
      symbols[pair.left] = tokens[static_cast<size_t>(merge_result[static_cast<size_t>(pair.rank)])];
      gone[right] = true;
      next[pair.left] = next[right];
      if (next[right] != none) previous[next[right]] = pair.left;
      offer(previous[pair.left]);
      offer(pair.left);
    }
    std::vector<std::string> kept;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (!gone[i]) kept.push_back(std::move(symbols[i]));
    }
    symbols = std::move(kept);
  }

  // Pieces longer than this are not cached: a SentencePiece file's whole text may be one piece.
  static constexpr size_t kCachedPieceBytes = 256;

  // The ids of one pre-tokenised piece (raw UTF-8).
  std::vector<int64_t> encode_piece(const std::string& piece) const {
    const bool cached = piece.size() <= kCachedPieceBytes;
    if (cached) {
      std::lock_guard<std::mutex> lock(cache_mutex);
      if (const auto hit = cache.find(piece); hit != cache.end()) return hit->second;
    }
    std::vector<std::string> symbols = characters ? character_symbols(piece) : byte_symbols(piece);
    if (ignore_merges && symbols.size() > 1) {  // a piece that is a token of its own is taken whole
      const std::string whole = characters ? piece : text::join(symbols, "");
      if (vocab.count(whole)) symbols = {whole};
    }
    merge(symbols);
    std::vector<int64_t> ids;
    for (const std::string& symbol : symbols) {
      const auto id = vocab.find(symbol);
      KUAFU_CHECK(id != vocab.end() || unknown, "byte-level BPE: symbol '", text::abbreviate(symbol),
                  "' is not in the vocabulary (it must hold all 256 byte symbols)");
      ids.push_back(id != vocab.end() ? id->second : *unknown);
    }
    if (cached) {
      std::lock_guard<std::mutex> lock(cache_mutex);
      cache.emplace(piece, ids);
    }
    return ids;
  }

  // Metaspace's pieces of a stretch of text (between special tokens); `at_start`: the stretch begins the
  // text, where prepend_scheme "first" puts its mark.
  void for_each_metaspace_piece(const std::string& stretch, bool at_start,
                                const std::function<void(const std::string&)>& piece) const {
    const std::string& mark = metaspace->replacement;
    std::string marked = replace_all(stretch, " ", mark);
    const bool prepend = metaspace->prepend == Prepend::Always || (metaspace->prepend == Prepend::First && at_start);
    if (prepend && !text::starts_with(marked, mark)) marked.insert(0, mark);
    if (!metaspace->split) return piece(marked);
    size_t begin = 0;  // each mark but a leading one starts a new piece
    for (size_t at = marked.find(mark, 1); at != std::string::npos; at = marked.find(mark, at + mark.size())) {
      piece(marked.substr(begin, at - begin));
      begin = at;
    }
    piece(marked.substr(begin));
  }

  // Ordinary text (no special tokens) -> ids; `at_start`: the text begins what encode was given.
  void encode_text(const std::string& text, bool at_start, std::vector<int64_t>& ids) const {
    if (text.empty()) return;
    auto encode_one = [&](const std::string& piece) {
      for (int64_t id : encode_piece(piece)) ids.push_back(id);
    };
    if (characters) {  // SentencePiece's: Metaspace's pieces, or the whole text as one (the older files)
      if (metaspace) {
        for_each_metaspace_piece(text, at_start, encode_one);
      } else {
        encode_one(text);
      }
      return;
    }
    auto encode_pieces = [&](const std::string& part) {
      if (byte_level_regex) {
        for_each_match(*pattern, part, encode_one);
      } else {
        encode_one(part);
      }
    };
    if (word_pattern) {
      for_each_match(*word_pattern, text, encode_pieces, keep_gaps);
    } else {
      encode_pieces(text);
    }
  }

  // A SentencePiece file's text of tokens: its decoder's steps, then the pieces joined.
  std::string decoded(std::vector<std::string> pieces) const;
};

BpeTokenizer::BpeTokenizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer BpeTokenizer::from_files(const std::string& vocab_json, const std::string& merges_txt,
                                      const std::vector<std::string>& special) {
  auto state = std::make_unique<State>();
  const nlohmann::json vocab = read_json_file(vocab_json);
  KUAFU_CHECK(vocab.is_object(), vocab_json, ": expected an object of token -> id");
  state->listed_tokens = static_cast<int64_t>(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    KUAFU_CHECK(id.is_number_integer(), vocab_json, ": token '", text::abbreviate(token), "' has no integer id");
    state->add_token(token, id.get<int64_t>(), vocab_json);
  }
  std::ifstream in(merges_txt);
  KUAFU_CHECK(in, "cannot read ", merges_txt);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && text::starts_with(line, "#version"))) continue;
    const size_t space = line.find(' ');
    const std::string where = merges_txt + ":" + std::to_string(number);
    KUAFU_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos, where,
                ": expected \"left right\", found \"", text::abbreviate(line), "\"");
    state->add_merge(line.substr(0, space), line.substr(space + 1), where);
  }
  for (const std::string& token : special) state->add_special(token, vocab_json);
  return BpeTokenizer(std::move(state));
}

std::string BpeTokenizer::State::normalized(const std::string& text) const {
  if (normalizers.empty() || text.empty()) return text;
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(text);
  for (const NormalizeStep& normalizer : normalizers) {
    const Normalize step = normalizer.kind;
    if (step == Normalize::Prepend) {
      if (!s.isEmpty()) s.insert(0, icu::UnicodeString::fromUTF8(normalizer.text));
      continue;
    }
    if (step == Normalize::Replace) {
      s.findAndReplace(icu::UnicodeString::fromUTF8(normalizer.text), icu::UnicodeString::fromUTF8(normalizer.replacement));
      continue;
    }
    if (step == Normalize::Lowercase) {
      s.toLower(icu::Locale::getRoot());  // Unicode's default full lower-case mapping, as Rust's to_lowercase
      continue;
    }
    if (step == Normalize::CollapseWhitespace) {
      static const std::unique_ptr<icu::RegexPattern> whitespace = compile(R"(\s+)");
      UErrorCode status = U_ZERO_ERROR;
      std::unique_ptr<icu::RegexMatcher> matcher(whitespace->matcher(s, status));
      s = matcher->replaceAll(icu::UnicodeString(" "), status);
      KUAFU_CHECK(U_SUCCESS(status), "ICU regex: ", u_errorName(status));
      continue;
    }
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* form = step == Normalize::Nfc    ? icu::Normalizer2::getNFCInstance(status)
                                   : step == Normalize::Nfd  ? icu::Normalizer2::getNFDInstance(status)
                                   : step == Normalize::Nfkc ? icu::Normalizer2::getNFKCInstance(status)
                                                             : icu::Normalizer2::getNFKDInstance(status);
    KUAFU_CHECK(U_SUCCESS(status), "ICU has no Unicode normalizer: ", u_errorName(status));
    s = form->normalize(s, status);
    KUAFU_CHECK(U_SUCCESS(status), "Unicode normalization failed: ", u_errorName(status));
  }
  std::string out;
  s.toUTF8String(out);
  return out;
}

namespace {

// tokenizers' ByteFallback decoder: each run of "<0xNN>" tokens becomes the text its bytes spell, or one
// U+FFFD per byte when they are no valid UTF-8.
std::vector<std::string> bytes_to_text(const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  std::string bytes;
  auto flush = [&] {
    if (bytes.empty()) return;
    if (text::first_invalid_utf8(bytes)) {
      out.insert(out.end(), bytes.size(), "\xEF\xBF\xBD");
    } else {
      out.push_back(bytes);
    }
    bytes.clear();
  };
  for (const std::string& piece : pieces) {
    if (const std::optional<uint8_t> byte = byte_of_token(piece)) {
      bytes.push_back(static_cast<char>(*byte));
      continue;
    }
    flush();
    out.push_back(piece);
  }
  flush();
  return out;
}

// tokenizers' Strip decoder on one piece: up to `start` leading and `stop` trailing `content`s removed.
std::string strip(std::string piece, const std::string& content, int64_t start, int64_t stop) {
  for (int64_t i = 0; i < start && text::starts_with(piece, content); ++i) piece.erase(0, content.size());
  for (int64_t i = 0; i < stop && text::ends_with(piece, content); ++i) piece.erase(piece.size() - content.size());
  return piece;
}

}  // namespace

std::string BpeTokenizer::State::decoded(std::vector<std::string> pieces) const {
  for (const DecodeStep& step : decoder) {
    switch (step.kind) {
      case Decode::Replace:
        for (std::string& piece : pieces) piece = replace_all(piece, step.text, step.replacement);
        break;
      case Decode::ByteFallback:
        pieces = bytes_to_text(pieces);
        break;
      case Decode::Fuse:
        pieces = {text::join(pieces, "")};
        break;
      case Decode::Strip:
        for (std::string& piece : pieces) piece = strip(piece, step.text, step.start, step.stop);
        break;
      case Decode::Metaspace:  // the first token's marks were put there by the pre-tokenizer: dropped
        for (size_t i = 0; i < pieces.size(); ++i) {
          pieces[i] = replace_all(pieces[i], step.text, i == 0 && step.prepend != Prepend::Never ? "" : " ");
        }
        break;
    }
  }
  return text::join(pieces, "");
}

namespace {

// tokenizer.json's fields: the string `key` of `object`, or "" when `object` is no object or holds no
// string there. nlohmann::json's value() throws its own type_error (no file named) for a key of another
// type, and operator[] of a const object reads freed memory for a missing key (found by fuzz_tokenizer_json).
std::string string_at(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return "";
  const auto found = object.find(key);
  return found != object.end() && found->is_string() ? found->get<std::string>() : "";
}

// The boolean `key` of `object`, `fallback` when absent; kuafu::Error naming `where` for another type.
bool flag_at(const nlohmann::json& object, const char* key, bool fallback, const std::string& where) {
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return fallback;
  KUAFU_CHECK(found->is_boolean(), where, ".", key, " must be true or false, found ", text::abbreviate(found->dump()));
  return found->get<bool>();
}

// tokenizer.json's "normalizer" as steps; kuafu::Error naming a type Kuafu does not apply.
void read_normalizer(const nlohmann::json& normalizer, const std::string& path,
                     std::vector<BpeTokenizer::State::NormalizeStep>& steps) {
  using Normalize = BpeTokenizer::State::Normalize;
  if (normalizer.is_null()) return;
  const std::string type = string_at(normalizer, "type");
  if (type == "Sequence" && normalizer.contains("normalizers") && normalizer["normalizers"].is_array()) {
    for (const nlohmann::json& step : normalizer["normalizers"]) read_normalizer(step, path, steps);
    return;
  }
  const bool replace = type == "Replace" && normalizer.contains("pattern") && normalizer.contains("content") &&
                       normalizer["content"].is_string();
  if (replace && string_at(normalizer["pattern"], "Regex") == "\\s+" && string_at(normalizer, "content") == " ") {
    steps.push_back({Normalize::CollapseWhitespace});  // CLIP's: every run of whitespace one space
    return;
  }
  // Llama 2's older files: a "▁" before the text, and one for each space.
  if (replace && !string_at(normalizer["pattern"], "String").empty()) {
    steps.push_back({Normalize::Replace, string_at(normalizer["pattern"], "String"), string_at(normalizer, "content")});
    return;
  }
  if (type == "Prepend" && normalizer.contains("prepend") && normalizer["prepend"].is_string()) {
    steps.push_back({Normalize::Prepend, string_at(normalizer, "prepend")});
    return;
  }
  static const std::vector<std::pair<std::string, Normalize>> known = {
      {"Lowercase", Normalize::Lowercase}, {"NFC", Normalize::Nfc}, {"NFD", Normalize::Nfd},
      {"NFKC", Normalize::Nfkc}, {"NFKD", Normalize::Nfkd}};
  for (const auto& [name, step] : known) {
    if (type == name) {
      steps.push_back({step});
      return;
    }
  }
  fail(path + ": normalizer \"" + text::abbreviate(type) +
       "\" is not supported (Kuafu applies Lowercase, NFC, NFD, NFKC, NFKD, Prepend, Replace of a string, CLIP's "
       "whitespace Replace and Sequences of them); ids would differ from transformers'");
}

// A ByteLevel pre-tokenizer, alone or after a Split by a Regex pattern (CLIP, Llama 3, Qwen).
void read_byte_level(const nlohmann::json& pre, const std::string& path, BpeTokenizer::State& state) {
  KUAFU_CHECK(pre.is_object(), path, ": expected a ByteLevel pre_tokenizer (byte-level BPE), a Metaspace one or none "
              "(SentencePiece's BPE)");
  nlohmann::json byte_level = pre;
  if (string_at(pre, "type") == "Sequence") {  // words split by a pattern, then ByteLevel (CLIP, Llama 3, Qwen)
    const auto steps = pre.find("pretokenizers");
    const bool listed = steps != pre.end() && steps->is_array() && steps->size() == 2;
    const std::string behavior = listed ? string_at((*steps)[0], "behavior") : "";
    const bool inverted = listed && flag_at((*steps)[0], "invert", false, path + ": pre_tokenizer.pretokenizers[0]");
    // The pattern matches CLIP's words (inverted, the rest removed) or Llama 3's and Qwen's delimiters,
    // kept as pieces between the text around them (isolated, not inverted).
    const bool split = listed && string_at((*steps)[0], "type") == "Split" &&
                       ((behavior == "Removed" && inverted) || (behavior == "Isolated" && !inverted)) &&
                       (*steps)[0].contains("pattern") && (*steps)[0]["pattern"].is_object() &&
                       (*steps)[0]["pattern"].contains("Regex") && (*steps)[0]["pattern"]["Regex"].is_string();
    KUAFU_CHECK(split, path, ": a Sequence pre_tokenizer is read only as a Split by a Regex pattern then ByteLevel, as CLIP "
                             "(behavior Removed, inverted) and Llama 3 and Qwen (behavior Isolated, not inverted) write it");
    state.word_pattern_text = string_at((*steps)[0]["pattern"], "Regex");
    state.word_pattern = compile(state.word_pattern_text.c_str());
    state.keep_gaps = behavior == "Isolated";
    byte_level = (*steps)[1];
  }
  KUAFU_CHECK(string_at(byte_level, "type") == "ByteLevel", path, ": expected a ByteLevel pre_tokenizer (byte-level BPE), a "
              "Metaspace one or none (SentencePiece's BPE)");
  state.add_prefix_space = flag_at(byte_level, "add_prefix_space", false, path + ": pre_tokenizer");
  state.byte_level_regex = flag_at(byte_level, "use_regex", true, path + ": pre_tokenizer");
}

// A Metaspace's prepend_scheme (pre-tokenizer or decoder); files older than the field say add_prefix_space
// (true: always), as tokenizers reads them.
BpeTokenizer::State::Prepend read_prepend(const nlohmann::json& metaspace, const std::string& where) {
  using Prepend = BpeTokenizer::State::Prepend;
  const auto scheme = metaspace.find("prepend_scheme");
  if (scheme == metaspace.end() || scheme->is_null()) {
    return flag_at(metaspace, "add_prefix_space", true, where) ? Prepend::Always : Prepend::Never;
  }
  const std::string name = scheme->is_string() ? scheme->get<std::string>() : scheme->dump();
  if (name == "first") return Prepend::First;
  if (name == "always") return Prepend::Always;
  if (name == "never") return Prepend::Never;
  fail(where + ".prepend_scheme \"" + text::abbreviate(name) + "\" is not supported (first, always or never)");
}

// A Metaspace's replacement: one character ("▁").
std::string read_replacement(const nlohmann::json& metaspace, const std::string& where) {
  const std::string replacement = string_at(metaspace, "replacement");
  KUAFU_CHECK(!replacement.empty() && !text::first_invalid_utf8(replacement) && text::utf8_length(replacement[0]) == replacement.size(),
              where, ".replacement must be one character, found ",
              text::abbreviate(metaspace.contains("replacement") ? metaspace["replacement"].dump() : "nothing"));
  return replacement;
}

// A count of a decoder step (Strip's start and stop): a whole number from 0, 0 when absent.
int64_t count_at(const nlohmann::json& object, const char* key, const std::string& where) {
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return 0;
  KUAFU_CHECK(found->is_number_integer() && found->get<int64_t>() >= 0, where, ".", key, " must be a whole number from 0, found ",
              text::abbreviate(found->dump()));
  return found->get<int64_t>();
}

// A SentencePiece file's decoder as steps; kuafu::Error naming the step Kuafu does not apply.
void read_decoder(const nlohmann::json& decoder, const std::string& where, std::vector<BpeTokenizer::State::DecodeStep>& steps) {
  using Decode = BpeTokenizer::State::Decode;
  const std::string type = string_at(decoder, "type");
  if (type == "Sequence" && decoder.contains("decoders") && decoder["decoders"].is_array()) {
    for (size_t i = 0; i < decoder["decoders"].size(); ++i) {
      read_decoder(decoder["decoders"][i], where + ".decoders[" + std::to_string(i) + "]", steps);
    }
    return;
  }
  if (type == "Replace" && decoder.contains("pattern") && !string_at(decoder["pattern"], "String").empty() &&
      decoder.contains("content") && decoder["content"].is_string()) {
    steps.push_back({Decode::Replace, string_at(decoder["pattern"], "String"), string_at(decoder, "content")});
    return;
  }
  if (type == "ByteFallback" || type == "Fuse") {
    steps.push_back({type == "Fuse" ? Decode::Fuse : Decode::ByteFallback});
    return;
  }
  if (type == "Strip" && !string_at(decoder, "content").empty()) {
    steps.push_back({Decode::Strip, string_at(decoder, "content"), "", count_at(decoder, "start", where),
                     count_at(decoder, "stop", where)});
    return;
  }
  if (type == "Metaspace") {
    BpeTokenizer::State::DecodeStep step{Decode::Metaspace, read_replacement(decoder, where), " "};
    step.prepend = read_prepend(decoder, where);
    steps.push_back(step);
    return;
  }
  fail(where + " \"" + text::abbreviate(type.empty() ? decoder.dump() : type) +
       "\" is not supported (a SentencePiece file's decoder is read as Metaspace or a Sequence of Replace of a string, "
       "ByteFallback, Fuse and Strip); decoded text would differ from transformers'");
}

// byte_fallback spells a character by its bytes' tokens: all 256 must be there (else tokenizers falls back
// to unk_token character by character, which Kuafu does not follow).
void check_byte_tokens(const BpeTokenizer::State& state, const std::string& where) {
  for (int b = 0; b < 256; ++b) {
    const std::string token = byte_token(static_cast<uint8_t>(b));
    KUAFU_CHECK(state.vocab.count(token), where, " needs the 256 byte tokens <0x00> .. <0xFF> in the vocabulary, and it lacks ",
                token);
  }
}

// tokenizer.json's "post_processor" for a single text: TemplateProcessing's special tokens before and after
// its sequence A (their ids as its special_tokens list them), RobertaProcessing's and BertProcessing's cls
// before and sep after, ByteLevel's nothing; a Sequence applies each in turn, the later wrapping the earlier.
void read_post_processor(const nlohmann::json& post, const std::string& where, BpeTokenizer::State& state) {
  if (post.is_null()) return;
  const std::string type = string_at(post, "type");
  if (type == "ByteLevel") return;
  std::vector<int64_t> before, after;
  if (type == "Sequence") {
    const auto steps = post.find("processors");
    KUAFU_CHECK(steps != post.end() && steps->is_array(), where, ".processors must be a list");
    for (size_t i = 0; i < steps->size(); ++i) read_post_processor((*steps)[i], where + ".processors[" + std::to_string(i) + "]", state);
    return;
  } else if (type == "TemplateProcessing") {
    const auto single = post.find("single");
    KUAFU_CHECK(single != post.end() && single->is_array(), where, ".single must be a list");
    bool seen_text = false;
    for (const nlohmann::json& item : *single) {
      if (item.contains("Sequence")) {
        KUAFU_CHECK(string_at(item["Sequence"], "id") == "A" && !seen_text, where, ".single: expected one sequence, A, found ",
                    text::abbreviate(item.dump()));
        seen_text = true;
        continue;
      }
      const std::string name = item.contains("SpecialToken") ? string_at(item["SpecialToken"], "id") : "";
      KUAFU_CHECK(!name.empty(), where, ".single: expected {\"SpecialToken\": ...} or {\"Sequence\": ...}, found ",
                  text::abbreviate(item.dump()));
      const nlohmann::json* listed = post.contains("special_tokens") && post["special_tokens"].contains(name)
                                         ? &post["special_tokens"][name] : nullptr;
      KUAFU_CHECK(listed && listed->contains("ids") && (*listed)["ids"].is_array(), where, ".special_tokens lacks the ids of '",
                  text::abbreviate(name), "'");
      for (const nlohmann::json& id : (*listed)["ids"]) {
        KUAFU_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < static_cast<int64_t>(state.tokens.size()),
                    where, ".special_tokens['", text::abbreviate(name), "'] has an id outside the vocabulary: ", text::abbreviate(id.dump()));
        (seen_text ? after : before).push_back(id.get<int64_t>());
      }
    }
    KUAFU_CHECK(seen_text, where, ".single has no sequence A");
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const auto pair = post.find(key);
      KUAFU_CHECK(pair != post.end() && pair->is_array() && pair->size() == 2 && (*pair)[1].is_number_integer() &&
                      (*pair)[1].get<int64_t>() >= 0 && (*pair)[1].get<int64_t>() < static_cast<int64_t>(state.tokens.size()),
                  where, ".", key, " must be [token, id] of the vocabulary");
      (std::string(key) == "cls" ? before : after).push_back((*pair)[1].get<int64_t>());
    }
  } else {
    fail(detail::concat(where, " \"", text::abbreviate(type), "\" is not supported (TemplateProcessing, ByteLevel, RobertaProcessing, "
                        "BertProcessing or a Sequence of them)"));
  }
  state.added_before.insert(state.added_before.begin(), before.begin(), before.end());
  state.added_after.insert(state.added_after.end(), after.begin(), after.end());
}

// transformers 5 without a tokenizer.json (a tokenizer.model, or vocab.json + merges.txt): tokenizer_config's
// add_bos_token and add_eos_token (false when absent) put its bos_token and eos_token (`default_bos`,
// `default_eos` when it names none) around a text.
void read_added_flags(const nlohmann::json& config, const std::string& config_path, const std::string& default_bos,
                      const std::string& default_eos, BpeTokenizer::State& state) {
  for (const auto& [flag, key, fallback] : {std::tuple{"add_bos_token", "bos_token", default_bos},
                                            std::tuple{"add_eos_token", "eos_token", default_eos}}) {
    if (!flag_at(config, flag, false, config_path)) continue;
    const nlohmann::json named = config.contains(key) ? config[key] : nlohmann::json(fallback);
    const std::string token = named.is_string() ? named.get<std::string>() : string_at(named, "content");
    const auto found = state.vocab.find(token);
    KUAFU_CHECK(!token.empty() && found != state.vocab.end(), config_path, ": ", flag, " is true but its ", key, " '",
                text::abbreviate(token), "' is not in the vocabulary");
    (std::string(flag) == "add_bos_token" ? state.added_before : state.added_after).push_back(found->second);
  }
}

}  // namespace

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::string& path) {
  const nlohmann::json file = read_json_file(path);
  const auto model = file.find("model");
  KUAFU_CHECK(model != file.end() && string_at(*model, "type") == "BPE", path,
              ": expected a BPE model (\"model\": {\"type\": \"BPE\", ...})");
  auto state = std::make_unique<State>();
  // No pre-tokenizer (Llama 2's older files: the normalizer puts in the "▁"s) or a Metaspace one: SentencePiece's
  // BPE over characters. Otherwise byte-level.
  const auto pre = file.find("pre_tokenizer");
  state->characters = pre == file.end() || pre->is_null() || string_at(*pre, "type") == "Metaspace";
  if (!state->characters) {
    read_byte_level(*pre, path, *state);
  } else if (pre != file.end() && !pre->is_null()) {
    const std::string where = path + ": pre_tokenizer";
    state->metaspace =
        State::Metaspace{read_replacement(*pre, where), read_prepend(*pre, where), flag_at(*pre, "split", true, where)};
  }
  state->ignore_merges = flag_at(*model, "ignore_merges", false, path + ": model");
  if (model->contains("end_of_word_suffix") && (*model)["end_of_word_suffix"].is_string()) {
    state->word_end = (*model)["end_of_word_suffix"].get<std::string>();
  }
  KUAFU_CHECK(!model->contains("continuing_subword_prefix") || (*model)["continuing_subword_prefix"].is_null() ||
                  (*model)["continuing_subword_prefix"] == "",
              path, ": model.continuing_subword_prefix is not supported");
  const auto dropout = model->find("dropout");
  KUAFU_CHECK(dropout == model->end() || dropout->is_null() || (dropout->is_number() && dropout->get<double>() == 0.0), path,
              ": model.dropout ", text::abbreviate(dropout->dump()), " is not supported (BPE dropout gives random ids)");
  if (state->characters) {
    KUAFU_CHECK(state->word_end.empty(), path, ": model.end_of_word_suffix is not supported with SentencePiece's layout "
                "(a Metaspace pre_tokenizer or none)");
    state->byte_fallback = flag_at(*model, "byte_fallback", false, path + ": model");
    state->fuse_unknown = flag_at(*model, "fuse_unk", false, path + ": model");
    const auto decoder = file.find("decoder");
    KUAFU_CHECK(decoder != file.end() && !decoder->is_null(), path, ": decoder: SentencePiece's layout needs one (Metaspace, or "
                "a Sequence of Replace, ByteFallback, Fuse and Strip as Llama 2's)");
    read_decoder(*decoder, path + ": decoder", state->decoder);
  }
  if (const auto normalizer = file.find("normalizer"); normalizer != file.end()) read_normalizer(*normalizer, path, state->normalizers);
  KUAFU_CHECK(model->contains("vocab") && (*model)["vocab"].is_object(), path, ": model.vocab must be an object");
  const auto added = file.find("added_tokens");
  state->listed_tokens = static_cast<int64_t>((*model)["vocab"].size() + (added != file.end() ? added->size() : 0));
  for (const auto& [token, id] : (*model)["vocab"].items()) {
    KUAFU_CHECK(id.is_number_integer(), path, ": model.vocab['", text::abbreviate(token), "'] has no integer id");
    state->add_token(token, id.get<int64_t>(), path);
  }
  if (state->byte_fallback) check_byte_tokens(*state, path + ": model.byte_fallback");
  if (added != file.end() && added->is_array()) {
    for (const auto& token : *added) {
      const std::string content = string_at(token, "content");
      KUAFU_CHECK(token.is_object() && token.contains("id") && token["id"].is_number_integer() && !content.empty(), path,
                  ": added_tokens: expected {\"id\": <integer>, \"content\": <non-empty text>}, found ",
                  text::abbreviate(token.dump()));
      const int64_t id = token["id"].get<int64_t>();
      state->add_token(content, id, path);
      state->add_special(content, path);
      const std::string where = path + ": added_tokens '" + text::abbreviate(content) + "'";
      KUAFU_CHECK(!flag_at(token, "single_word", false, where), where, ": single_word is not supported");
      if (flag_at(token, "lstrip", false, where)) state->strips_left.insert(id);
      if (flag_at(token, "rstrip", false, where)) state->strips_right.insert(id);
    }
  }
  if (model->contains("unk_token") && (*model)["unk_token"].is_string()) {  // what a symbol the vocabulary lacks reads as
    const std::string unk = (*model)["unk_token"].get<std::string>();
    const auto found = state->vocab.find(unk);
    KUAFU_CHECK(found != state->vocab.end(), path, ": model.unk_token '", text::abbreviate(unk), "' is not in the vocabulary");
    state->unknown = found->second;
  }
  const auto merges = model->find("merges");
  KUAFU_CHECK(merges != model->end() && merges->is_array(), path, ": model.merges must be a list");
  for (size_t i = 0; i < merges->size(); ++i) {
    const nlohmann::json& merge = (*merges)[i];
    const std::string where = path + ": model.merges[" + std::to_string(i) + "]";
    if (merge.is_string()) {  // "left right" (older files)
      const std::string pair = merge.get<std::string>();
      const size_t space = pair.find(' ');
      KUAFU_CHECK(space != std::string::npos, where, ": expected \"left right\"");
      state->add_merge(pair.substr(0, space), pair.substr(space + 1), where);
    } else {  // ["left", "right"]
      KUAFU_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(), where,
                  ": expected a pair of strings");
      state->add_merge(merge[0].get<std::string>(), merge[1].get<std::string>(), where);
    }
  }
  if (const auto post = file.find("post_processor"); post != file.end()) read_post_processor(*post, path + ": post_processor", *state);
  return BpeTokenizer(std::move(state));
}

BpeTokenizer BpeTokenizer::clip_from_files(const std::string& vocab_json, const std::string& merges_txt,
                                           std::vector<std::string> special) {
  const std::string start = "<|startoftext|>", end = "<|endoftext|>";
  special.insert(special.end(), {start, end});
  BpeTokenizer tokenizer = from_files(vocab_json, merges_txt, special);
  State& state = *tokenizer.state_;
  state.normalizers = {{State::Normalize::Nfc}, {State::Normalize::CollapseWhitespace}, {State::Normalize::Lowercase}};
  state.word_pattern_text = kClipWordPattern;
  state.word_pattern = compile(kClipWordPattern);
  state.word_end = "</w>";
  state.unknown = state.vocab.at(end);
  return tokenizer;
}

namespace {

// transformers 5's LlamaTokenizer (the class Llama 2's, Mistral's and TinyLlama's tokenizer_config.json name)
// takes only the vocabulary, merges, added tokens and post-processor from tokenizer.json and builds the
// rest itself: no normalizer; a Metaspace (split false) putting "▁" before the text's first stretch
// ("legacy": false, its default), before every stretch ("legacy": true) or nowhere (add_prefix_space
// false); byte fallback; the decoder Replace "▁", ByteFallback, Fuse, then Strip of one leading space unless
// add_prefix_space is false. So a folder reads as AutoTokenizer reads it even where its file's older
// normalizer (Prepend "▁", Replace " ") says otherwise.
void read_as_llama_tokenizer(const nlohmann::json& config, const std::string& config_path, BpeTokenizer::State& state) {
  using State = BpeTokenizer::State;
  const bool prefix = flag_at(config, "add_prefix_space", true, config_path + ": tokenizer_config");
  const bool legacy = flag_at(config, "legacy", false, config_path + ": tokenizer_config");
  state.normalizers.clear();
  const State::Prepend prepend = !prefix ? State::Prepend::Never : legacy ? State::Prepend::Always : State::Prepend::First;
  state.metaspace = State::Metaspace{kSpaceMark, prepend, false};
  state.decoder = {{State::Decode::Replace, kSpaceMark, " "}, {State::Decode::ByteFallback}, {State::Decode::Fuse}};
  if (prefix) state.decoder.push_back({State::Decode::Strip, " ", "", 1, 0});
  state.byte_fallback = true;
  state.fuse_unknown = true;
  state.ignore_merges = false;
  check_byte_tokens(state, config_path + ": tokenizer_class " + string_at(config, "tokenizer_class") + " (byte fallback)");
}

// The special tokens a tokenizer_config.json or special_tokens_map.json names: bos, eos, unk, pad, ...
// (each a string or {"content": ...}), then additional_special_tokens / extra_special_tokens, then the
// contents of added_tokens_decoder; `defaults` stand for the keys the file leaves out.
std::vector<std::string> named_special_tokens(const nlohmann::json& config,
                                              const std::vector<std::pair<std::string, std::string>>& defaults = {}) {
  std::vector<std::string> tokens;
  auto collect = [&](const nlohmann::json& value) {
    const std::string token = value.is_string() ? value.get<std::string>() : string_at(value, "content");
    if (!token.empty() && std::find(tokens.begin(), tokens.end(), token) == tokens.end()) tokens.push_back(token);
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}) {
    if (config.is_object() && config.contains(key)) {
      if (!config[key].is_null()) collect(config[key]);
    } else {
      for (const auto& [name, token] : defaults) {
        if (name == key) collect(token);
      }
    }
  }
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    if (!config.is_object() || !config.contains(key)) continue;
    for (const auto& value : config[key]) collect(value);  // a list, or a map of names to tokens
  }
  if (config.is_object() && config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    for (const auto& [id, entry] : config["added_tokens_decoder"].items()) collect(entry);  // {"0": {"content": ...}}
  }
  return tokens;
}

// transformers' converter for a SentencePiece BPE model (SentencePieceExtractor, generate_merges), which
// LlamaTokenizer reads a tokenizer.model with: the pieces by id are the vocabulary; every cut of a piece
// into two pieces is a merge, ranked by the whole piece's id, then by where the cut falls (whole
// characters); control and user-defined pieces are matched whole in text, as are the tokens `config`
// names (LlamaTokenizer's <unk>, <s> and </s> where it names none); then read_as_llama_tokenizer.
void read_sentencepiece_bpe(const std::string& model_path, const nlohmann::json& config, const std::string& config_path,
                            BpeTokenizer::State& state) {
  using Model = SentencePieceModel;
  const Model model = read_sentencepiece_model(model_path);
  KUAFU_CHECK(model.model_type == Model::ModelType::Bpe, model_path, ": a SentencePiece ",
              model.model_type == Model::ModelType::Unigram ? "unigram" : "word or character",
              " model; Kuafu reads BPE models (Llama 2's, Mistral's), as transformers' LlamaTokenizer does");
  state.characters = true;
  state.listed_tokens = static_cast<int64_t>(model.pieces.size());
  for (size_t id = 0; id < model.pieces.size(); ++id) state.add_token(model.pieces[id].text, static_cast<int64_t>(id), model_path);
  std::vector<std::string> special;
  for (const Model::Piece& piece : model.pieces) {
    if (piece.type == Model::PieceType::Control || piece.type == Model::PieceType::UserDefined) special.push_back(piece.text);
  }
  for (const std::string& token : named_special_tokens(config, {{"unk_token", "<unk>"}, {"bos_token", "<s>"}, {"eos_token", "</s>"}})) {
    KUAFU_CHECK(state.vocab.count(token), config_path, ": special token '", text::abbreviate(token), "' is not a piece of ",
                model_path, " (Kuafu does not add tokens past the model's pieces)");
    special.push_back(token);
  }
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    for (const auto& [id, entry] : config["added_tokens_decoder"].items()) {
      const std::string token = string_at(entry, "content");
      const auto found = state.vocab.find(token);
      KUAFU_CHECK(found != state.vocab.end() && std::to_string(found->second) == id, config_path, ": added_tokens_decoder gives '",
                  text::abbreviate(token), "' id ", id, ", but it is ",
                  found == state.vocab.end() ? std::string("no piece") : "piece " + std::to_string(found->second), " of ", model_path);
    }
  }
  for (const std::string& token : special) state.add_special(token, model_path);
  for (const Model::Piece& piece : model.pieces) {
    const std::string& whole = piece.text;
    for (size_t cut = text::utf8_length(whole[0]); cut < whole.size(); cut += text::utf8_length(whole[cut])) {
      const std::string left = whole.substr(0, cut), right = whole.substr(cut);
      if (state.vocab.count(left) && state.vocab.count(right)) state.add_merge(left, right, model_path);
    }
  }
  read_as_llama_tokenizer(config, config_path, state);
}

}  // namespace

BpeTokenizer BpeTokenizer::from_folder(const std::string& dir) {
  const fs::path root = dir;
  if (!fs::exists(root / "tokenizer.json") && fs::exists(root / "tokenizer.model")) {
    const fs::path config_path = root / "tokenizer_config.json";
    const nlohmann::json config = fs::exists(config_path) ? read_json_file(config_path.string()) : nlohmann::json::object();
    const std::string name = string_at(config, "tokenizer_class");
    KUAFU_CHECK(name.empty() || name == "LlamaTokenizer" || name == "LlamaTokenizerFast", config_path.string(),
                ": tokenizer_class ", name, " with a tokenizer.model and no tokenizer.json is not supported (Kuafu reads a "
                "SentencePiece model as transformers' LlamaTokenizer; give the folder's tokenizer.json)");
    auto state = std::make_unique<State>();
    read_sentencepiece_bpe((root / "tokenizer.model").string(), config, config_path.string(), *state);
    read_added_flags(config, config_path.string(), "<s>", "</s>", *state);
    return BpeTokenizer(std::move(state));
  }
  if (fs::exists(root / "tokenizer.json")) {
    BpeTokenizer tokenizer = from_tokenizer_json((root / "tokenizer.json").string());
    // A SentencePiece file under transformers' LlamaTokenizer reads as that class builds it.
    const fs::path config_path = root / "tokenizer_config.json";
    if (tokenizer.state_->characters && fs::exists(config_path)) {
      const nlohmann::json config = read_json_file(config_path.string());
      const std::string name = string_at(config, "tokenizer_class");
      if (name == "LlamaTokenizer" || name == "LlamaTokenizerFast") {
        read_as_llama_tokenizer(config, config_path.string(), *tokenizer.state_);
      }
    }
    return tokenizer;
  }
  KUAFU_CHECK(fs::exists(root / "vocab.json") && fs::exists(root / "merges.txt"), dir,
              " has no tokenizer.json, no tokenizer.model (SentencePiece) and no vocab.json + merges.txt (byte-level BPE)");
  // The special tokens the folder names (bos, eos, unk, pad, ...).
  std::vector<std::string> special;
  bool add_prefix_space = false, clip = false;
  nlohmann::json tokenizer_config = nlohmann::json::object();
  for (const char* file : {"special_tokens_map.json", "tokenizer_config.json"}) {
    if (!fs::exists(root / file)) continue;
    const std::string path = (root / file).string();
    const nlohmann::json config = read_json_file(path);
    if (std::string(file) == "tokenizer_config.json") tokenizer_config = config;
    for (const std::string& token : named_special_tokens(config)) special.push_back(token);
    if (config.contains("add_prefix_space") && !config["add_prefix_space"].is_null()) {
      KUAFU_CHECK(config["add_prefix_space"].is_boolean(), path, ": add_prefix_space must be true or false");
      add_prefix_space = config["add_prefix_space"].get<bool>();
    }
    clip |= text::starts_with(config.value("tokenizer_class", std::string()), "CLIPTokenizer");
    for (const char* key : {"do_lower_case", "do_lowercase"}) {
      KUAFU_CHECK(clip || !config.value(key, false), path, ": ", key, " = true is not supported for byte-level BPE (ids would "
                  "differ from transformers'); give a tokenizer.json with a Lowercase normalizer");
    }
  }
  // Every special token the folder names is matched whole, as transformers does (SD 2.x pads with "!").
  if (clip) return clip_from_files((root / "vocab.json").string(), (root / "merges.txt").string(), special);
  BpeTokenizer tokenizer = from_files((root / "vocab.json").string(), (root / "merges.txt").string(), special);
  tokenizer.state_->add_prefix_space = add_prefix_space;
  read_added_flags(tokenizer_config, (root / "tokenizer_config.json").string(), "<|endoftext|>", "<|endoftext|>", *tokenizer.state_);
  return tokenizer;
}

const std::vector<int64_t>& BpeTokenizer::added_before() const { return state_->added_before; }
const std::vector<int64_t>& BpeTokenizer::added_after() const { return state_->added_after; }

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  if (const auto bad = text::first_invalid_utf8(text)) {
    fail("BPE: the text is not valid UTF-8 at byte " + std::to_string(*bad));
  }
  std::vector<int64_t> ids;
  // Special tokens first: the text between them is ordinary. Each special token's next occurrence is
  // kept and searched again only once passed, so a text with many of them is read once per token.
  const auto& specials = state_->special;
  std::vector<size_t> next(specials.size());
  for (size_t i = 0; i < specials.size(); ++i) next[i] = text.find(specials[i].first);
  size_t start = 0;
  while (start <= text.size()) {
    size_t found = std::string_view::npos;
    const std::pair<std::string, int64_t>* which = nullptr;
    for (size_t i = 0; i < specials.size(); ++i) {
      if (next[i] != std::string_view::npos && next[i] < start) next[i] = text.find(specials[i].first, start);
      if (next[i] < found) found = next[i], which = &specials[i];  // longest first: ties keep the longer token
    }
    std::string_view between = text.substr(start, found == std::string_view::npos ? std::string_view::npos : found - start);
    if (which && state_->strips_left.count(which->second)) between.remove_suffix(trailing_whitespace(between));
    std::string ordinary(between);
    // As Hugging Face's ByteLevel pre-tokenizer does, for each stretch between special tokens.
    ordinary = state_->normalized(ordinary);
    if (state_->add_prefix_space && !ordinary.empty() && ordinary[0] != ' ') ordinary.insert(0, 1, ' ');
    state_->encode_text(ordinary, start == 0, ids);
    if (!which) break;
    ids.push_back(which->second);
    start = found + which->first.size();
    if (state_->strips_right.count(which->second)) start += leading_whitespace(text.substr(start));
  }
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  auto token_of = [&](int64_t id) -> const std::string& {
    KUAFU_CHECK(id >= 0 && static_cast<size_t>(id) < state_->tokens.size() && !state_->tokens[static_cast<size_t>(id)].empty(),
                "BPE: id ", id, " is not in the vocabulary");
    return state_->tokens[static_cast<size_t>(id)];
  };
  if (state_->characters) {  // the tokens' texts through the file's decoder, special tokens too (as tokenizers does)
    std::vector<std::string> pieces;
    for (int64_t id : ids) pieces.push_back(token_of(id));
    return state_->decoded(std::move(pieces));
  }
  std::string out;
  for (int64_t id : ids) {
    const std::string& token = token_of(id);
    const bool special = std::any_of(state_->special.begin(), state_->special.end(), [&](const auto& s) { return s.second == id; });
    if (special) {
      out += token;
      continue;
    }
    // Each character of the token stands for one byte.
    for (size_t i = 0; i < token.size();) {
      const auto c = static_cast<unsigned char>(token[i]);
      const size_t length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : 3;
      uint32_t cp = length == 1 ? c : c & (0x7F >> length);
      for (size_t k = 1; k < length && i + k < token.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
      const auto byte = state_->symbol_byte.find(cp);
      KUAFU_CHECK(byte != state_->symbol_byte.end(), "byte-level BPE: token ", id, " ('", text::abbreviate(token),
                  "') holds a character that stands for no byte");
      out.push_back(static_cast<char>(byte->second));
      i += length;
    }
  }
  if (!state_->word_end.empty()) {  // CLIP: each word's end a space, the text trimmed (as transformers decodes)
    for (size_t at = out.find(state_->word_end); at != std::string::npos; at = out.find(state_->word_end, at + 1)) {
      out.replace(at, state_->word_end.size(), " ");
    }
    const size_t first = out.find_first_not_of(' '), last = out.find_last_not_of(' ');
    out = first == std::string::npos ? std::string() : out.substr(first, last - first + 1);
  }
  return out;
}

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(state_->tokens.size()); }

bool BpeTokenizer::same_as(const BpeTokenizer& other) const {
  const State& a = *state_;
  const State& b = *other.state_;
  auto sorted = [](std::vector<std::pair<std::string, int64_t>> special) {
    std::sort(special.begin(), special.end());
    return special;
  };
  // With byte fallback every character is spelt by tokens, so which token stands for an unknown one is moot.
  return a.tokens == b.tokens && a.merge_rank == b.merge_rank && sorted(a.special) == sorted(b.special) &&
         a.add_prefix_space == b.add_prefix_space && a.normalizers == b.normalizers && a.word_end == b.word_end &&
         (a.unknown == b.unknown || (a.characters && a.byte_fallback)) && a.word_pattern_text == b.word_pattern_text && a.keep_gaps == b.keep_gaps &&
         a.byte_level_regex == b.byte_level_regex && a.ignore_merges == b.ignore_merges && a.characters == b.characters &&
         a.byte_fallback == b.byte_fallback && a.fuse_unknown == b.fuse_unknown && a.metaspace == b.metaspace &&
         a.decoder == b.decoder && a.added_before == b.added_before && a.added_after == b.added_after &&
         a.strips_left == b.strips_left && a.strips_right == b.strips_right;
}

std::optional<int64_t> BpeTokenizer::token_id(const std::string& token) const {
  const auto found = state_->vocab.find(token);
  if (found == state_->vocab.end()) return std::nullopt;
  return found->second;
}

void BpeTokenizer::write_clip_characters(const std::string& dir) {
  KUAFU_CHECK(!fs::exists(dir), dir, " already exists; the tokenizer goes into a new folder");
  fs::create_directories(dir);
  const State state;  // its byte symbols
  nlohmann::ordered_json vocab;
  int64_t id = 0;
  for (const char* suffix : {"", "</w>"}) {
    for (const std::string& symbol : state.byte_symbol) vocab[symbol + suffix] = id++;
  }
  for (const char* special : {"<|startoftext|>", "<|endoftext|>"}) vocab[special] = id++;
  const nlohmann::ordered_json special = {
      {"bos_token", "<|startoftext|>"}, {"eos_token", "<|endoftext|>"}, {"pad_token", "<|endoftext|>"}, {"unk_token", "<|endoftext|>"}};
  nlohmann::ordered_json config = special;
  config["tokenizer_class"] = "CLIPTokenizer";
  config["model_max_length"] = 77;
  config["do_lower_case"] = true;
  const fs::path root = dir;
  write_file_atomic((root / "vocab.json").string(), vocab.dump());
  write_file_atomic((root / "merges.txt").string(), "#version: 0.2\n");
  write_file_atomic((root / "tokenizer_config.json").string(), config.dump(2));
  write_file_atomic((root / "special_tokens_map.json").string(), special.dump(2));
}

}  // namespace kuafu::io

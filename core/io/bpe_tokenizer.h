// Byte-level BPE, the tokenizer of GPT-2, OPT and RoBERTa (and CLIP's, with its word ends and cleaning): special tokens are matched whole first; the
// rest is cut by GPT-2's pre-tokenisation pattern (contractions, letters, digits, other symbols, runs
// of whitespace; ICU's regex engine supplies the Unicode classes), each piece's UTF-8 bytes become
// printable characters (GPT-2's bytes_to_unicode), and adjacent symbols merge in the order merges.txt
// ranks them. decode(encode(text)) == text for all valid UTF-8.
// Also SentencePiece's BPE as Llama 2's, Mistral's and TinyLlama's tokenizer.json or tokenizer.model hold it:
// symbols are characters, each space a "▁", a character outside the vocabulary spelt by its bytes' tokens <0xNN>.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kuafu::io {

class BpeTokenizer {
 public:
  // vocab.json (token -> id) and merges.txt (one "left right" pair per line, by rank); `special` are
  // tokens of the vocabulary matched whole in text (e.g. "<|endoftext|>"). kuafu::Error naming the file
  // and line or token for malformed input.
  static BpeTokenizer from_files(const std::string& vocab_json, const std::string& merges_txt,
                                 const std::vector<std::string>& special = {});
  // tokenizer.json as Hugging Face `tokenizers` saves it: a BPE model with a ByteLevel pre-tokenizer
  // (its add_prefix_space and use_regex honoured), after a Split by a Regex pattern where the file has one:
  // CLIP's (matches kept, the rest dropped; the model's end_of_word_suffix and unk_token), Llama 3's and
  // Qwen's (behavior "Isolated": the text between matches kept as pieces too; the model's ignore_merges);
  // its added tokens are the special ones; its normalizer applied (Lowercase, NFC, NFD, NFKC, NFKD, Prepend,
  // Replace of a string, CLIP's whitespace Replace, or a Sequence of them; any other refused by name).
  // SentencePiece's layout, as the `tokenizers` library reads it: no pre-tokenizer (Llama 2's older files,
  // whose normalizer Prepend "▁" + Replace " " -> "▁" marks the spaces; each stretch between special tokens
  // one piece) or a Metaspace (its replacement, prepend_scheme first / always / never, split); the model's
  // byte_fallback (all 256 <0xNN> tokens required), unk_token and fuse_unk; the decoder (Metaspace, or a
  // Sequence of Replace of a string, ByteFallback, Fuse and Strip, as Llama 2's) used by decode. Other
  // pre-tokenizers, decoders and options (dropout, a suffix with Metaspace) are refused naming the field.
  static BpeTokenizer from_tokenizer_json(const std::string& path);
  // CLIP's tokenizer (transformers' CLIPTokenizer): NFC, whitespace runs collapsed, lower-cased; words cut
  // by CLIP's pattern, each word's last symbol ending in "</w>"; "<|startoftext|>" and "<|endoftext|>"
  // special (and `special`'s tokens), a symbol the vocabulary lacks read as "<|endoftext|>". encode gives
  // the words' ids alone (the caller adds BOS and EOS); decode turns each "</w>" into a space and trims.
  static BpeTokenizer clip_from_files(const std::string& vocab_json, const std::string& merges_txt,
                                      std::vector<std::string> special = {});
  // A model folder: tokenizer.json when there is one, else vocab.json + merges.txt with the special
  // tokens tokenizer_config.json / special_tokens_map.json name and tokenizer_config.json's
  // add_prefix_space (do_lower_case refused by name); CLIP's when tokenizer_config.json names
  // CLIPTokenizer. A SentencePiece tokenizer.json beside a tokenizer_config.json naming LlamaTokenizer(Fast)
  // reads as transformers 5's AutoTokenizer reads it: that class keeps the file's vocabulary, merges and
  // added tokens but builds the rest itself (no normalizer; Metaspace, split false, prepend_scheme first,
  // always with "legacy": true, never with add_prefix_space false; byte fallback; Llama 2's decoder).
  // A folder with a SentencePiece tokenizer.model and no tokenizer.json (Llama 2's) reads as that class
  // reads it (transformers' converter): the model's pieces by id, every cut of a piece into two pieces a
  // merge ranked by the piece's id, its control and user-defined pieces and the tokens tokenizer_config.json
  // names matched whole (only BPE models; a class other than LlamaTokenizer refused by name).
  static BpeTokenizer from_folder(const std::string& dir);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // kuafu::Error naming the byte offset for text that is not valid UTF-8. The text's ids alone: no BOS or
  // EOS is added (added_before and added_after say what transformers would add).
  std::vector<int64_t> encode(std::string_view text) const;
  // What transformers 5's tokenizer(text)["input_ids"] puts before and after encode(text): a tokenizer.json's
  // post_processor (TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, a Sequence of them;
  // tokenizer_config.json's add_bos_token / add_eos_token are then ignored, as transformers 5 ignores them);
  // a folder without tokenizer.json: tokenizer_config.json's add_bos_token / add_eos_token (false when absent)
  // with its bos_token / eos_token. Empty for from_files.
  const std::vector<int64_t>& added_before() const;
  const std::vector<int64_t>& added_after() const;
  // Special tokens kept (transformers' decode(ids) with skip_special_tokens false).
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t vocab_size() const;  // the largest id + 1
  // Whether `other` gives every text the same ids: the same vocabulary, merges, special tokens and
  // normalisation (two folders' files may differ in form and still say the same).
  bool same_as(const BpeTokenizer& other) const;
  std::optional<int64_t> token_id(const std::string& token) const;

  // Writes a new CLIP tokenizer folder `dir` for a model trained from scratch: vocab.json of the 256 byte
  // symbols, each also ending in "</w>", then "<|startoftext|>" and "<|endoftext|>" (514 tokens); merges.txt
  // with no merges (every caption spelt out, one token a character); tokenizer_config.json naming
  // CLIPTokenizer (77 positions, lower-cased, <|endoftext|> as padding); special_tokens_map.json.
  // transformers' CLIPTokenizer reads it too.
  static void write_clip_characters(const std::string& dir);

  struct State;  // (public for the file's helpers; nothing outside bpe_tokenizer.cpp sees its definition)

 private:
  explicit BpeTokenizer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kuafu::io

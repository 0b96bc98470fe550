// Tokenizer: a thin, move-only wrapper over a SentencePiece model (training and encode/decode) that
// turns SentencePiece statuses into kuafu::Error and guarantees decode(encode(text)) == text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kuafu::io {

// Special ids of every model trained here. Encoding never emits bos/eos; callers insert them.
inline constexpr int kUnkId = 0;
inline constexpr int kBosId = 1;
inline constexpr int kEosId = 2;

struct TokenizerTrainOptions {
  std::string input_path;    // UTF-8 text; SentencePiece reads it one line per sentence
  std::string model_prefix;  // writes model_prefix + ".model" and ".vocab"
  // Includes the 3 special ids, the newline piece and, with byte_fallback, 256 byte pieces, so it
  // must be above ~260 plus the number of distinct characters when byte_fallback is on.
  int vocab_size = 4096;
  std::string model_type = "bpe";
  double character_coverage = 1.0;
  bool byte_fallback = true;
  int num_threads = 2;
  int64_t input_sentence_size = 0;  // 0 = all lines
};

// Trains a model with the text conventions below. Throws kuafu::Error with SentencePiece's message.
//
// Exact round trip: no normalization (identity rule), no dummy prefix, extra whitespace kept, and
// "\n" is a user-defined symbol, so a newline is always its own single token and multi-line text
// encodes as a whole. Without a dummy prefix decoding is plain concatenation:
// decode(a) + decode(b) == decode(a + b), as long as a cut does not split a byte-fallback character.
void train_tokenizer(const TokenizerTrainOptions& options);

class Tokenizer {
 public:
  // Throws kuafu::Error naming the path when the file is missing or not a SentencePiece model.
  static Tokenizer load(const std::string& model_path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Never emits bos/eos. Whole corpora are fine: the text is encoded line by line internally.
  std::vector<uint32_t> encode(const std::string& text) const;
  // Throws kuafu::Error for an id >= vocab_size().
  std::string decode(const std::vector<uint32_t>& ids) const;

  int vocab_size() const;
  int bos_id() const;
  int eos_id() const;
  const std::string& model_path() const { return model_path_; }

 private:
  Tokenizer() = default;

  struct Model;  // the SentencePiece processor

  std::string model_path_;
  std::unique_ptr<Model> model_;
  int newline_id_ = -1;  // the "\n" piece, or -1 when the model has none
};

}  // namespace kuafu::io

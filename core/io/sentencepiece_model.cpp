#include "core/io/sentencepiece_model.h"

#include <cstdint>
#include <cstring>

#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/text.h"
#include "core/util/utf8.h"

namespace kuafu::io {
namespace {

// Protocol buffers' wire format, as much as ModelProto needs: each field a key (number << 3 | wire type)
// then a varint (0), 8 bytes (1), a length and that many bytes (2) or 4 bytes (5).
class WireReader {
 public:
  WireReader(std::string_view bytes, size_t base, const std::string& where) : bytes_(bytes), base_(base), where_(where) {}

  bool done() const { return at_ == bytes_.size(); }
  size_t offset() const { return base_ + at_; }  // in the whole file

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      KUAFU_CHECK(at_ < bytes_.size(), where_, ": truncated at byte ", offset(), " (inside a number); not a SentencePiece model?");
      const auto byte = static_cast<uint8_t>(bytes_[at_++]);
      value |= uint64_t{byte & 0x7Fu} << shift;
      if (!(byte & 0x80)) return value;
    }
    fail(detail::concat(where_, ": a number longer than 10 bytes at byte ", offset(), "; not a SentencePiece model?"));
  }

  // The next field's number and wire type.
  std::pair<uint64_t, int> key() {
    const size_t start = offset();
    const uint64_t key = varint();
    const int wire = static_cast<int>(key & 7);
    KUAFU_CHECK(key >> 3 != 0 && (wire == 0 || wire == 1 || wire == 2 || wire == 5), where_, ": byte ", start,
                ": field ", key >> 3, " of wire type ", wire, " is not protocol buffers' (groups are not read); not a "
                "SentencePiece model?");
    return {key >> 3, wire};
  }

  // A length-delimited field's bytes, and where they begin in the file.
  std::pair<std::string_view, size_t> bytes() {
    const uint64_t length = varint();
    KUAFU_CHECK(length <= bytes_.size() - at_, where_, ": byte ", offset(), ": a field of ", length, " bytes runs past the ",
                bytes_.size() - at_, " left; the file is truncated or not a SentencePiece model");
    const size_t start = offset();
    const std::string_view field = bytes_.substr(at_, length);
    at_ += length;
    return {field, start};
  }

  float fixed32_float() {
    KUAFU_CHECK(bytes_.size() - at_ >= 4, where_, ": truncated at byte ", offset(), " (inside a score)");
    uint32_t bits = 0;
    for (int k = 0; k < 4; ++k) bits |= uint32_t{static_cast<uint8_t>(bytes_[at_ + k])} << (8 * k);  // little-endian
    at_ += 4;
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
  }

  void skip(int wire) {
    if (wire == 0) {
      varint();
    } else if (wire == 2) {
      bytes();
    } else {
      const size_t width = wire == 1 ? 8 : 4;
      KUAFU_CHECK(bytes_.size() - at_ >= width, where_, ": truncated at byte ", offset());
      at_ += width;
    }
  }

  // A field expected of one wire type; `what` names it in the error.
  void expect(int wire, int expected, const char* what, size_t start) const {
    KUAFU_CHECK(wire == expected, where_, ": byte ", start, ": ", what, " has wire type ", wire, ", expected ", expected,
                "; not a SentencePiece model?");
  }

 private:
  std::string_view bytes_;
  size_t base_;
  size_t at_ = 0;
  const std::string& where_;
};

// ModelProto.SentencePiece: piece = 1 (string), score = 2 (float), type = 3 (enum, Normal when absent).
SentencePieceModel::Piece read_piece(std::string_view bytes, size_t base, const std::string& where, size_t id) {
  WireReader reader(bytes, base, where);
  SentencePieceModel::Piece piece;
  bool has_text = false;
  while (!reader.done()) {
    const size_t start = reader.offset();
    const auto [field, wire] = reader.key();
    if (field == 1) {
      reader.expect(wire, 2, "a piece's text", start);
      const auto [text, at] = reader.bytes();
      const auto bad = text::first_invalid_utf8(text);
      KUAFU_CHECK(!bad, where, ": piece ", id, " (byte ", at, ") is not UTF-8 at its byte ", bad.value_or(0));
      piece.text = std::string(text);
      has_text = true;
    } else if (field == 2) {
      reader.expect(wire, 5, "a piece's score", start);
      piece.score = reader.fixed32_float();
    } else if (field == 3) {
      reader.expect(wire, 0, "a piece's type", start);
      const uint64_t type = reader.varint();
      KUAFU_CHECK(type >= 1 && type <= 6, where, ": piece ", id, " has type ", type,
                  " (SentencePiece's are 1 normal .. 6 byte)");
      piece.type = static_cast<SentencePieceModel::PieceType>(type);
    } else {
      reader.skip(wire);
    }
  }
  KUAFU_CHECK(has_text && !piece.text.empty(), where, ": piece ", id, " (byte ", base, ") has no text");
  return piece;
}

// TrainerSpec: model_type = 3 (enum); the rest is how the model was trained.
SentencePieceModel::ModelType read_model_type(std::string_view bytes, size_t base, const std::string& where) {
  WireReader reader(bytes, base, where);
  auto type = SentencePieceModel::ModelType::Unigram;
  while (!reader.done()) {
    const size_t start = reader.offset();
    const auto [field, wire] = reader.key();
    if (field != 3) {
      reader.skip(wire);
      continue;
    }
    reader.expect(wire, 0, "trainer_spec.model_type", start);
    const uint64_t value = reader.varint();
    KUAFU_CHECK(value >= 1 && value <= 4, where, ": trainer_spec.model_type ", value,
                " is not SentencePiece's (1 unigram, 2 BPE, 3 word, 4 char)");
    type = static_cast<SentencePieceModel::ModelType>(value);
  }
  return type;
}

}  // namespace

SentencePieceModel parse_sentencepiece_model(const std::string& bytes, const std::string& where) {
  // ModelProto: pieces = 1 (repeated), trainer_spec = 2; the normalizer specs (3, 5) and self-test data (4)
  // are skipped: transformers' LlamaTokenizer builds its own normalisation.
  WireReader reader(bytes, 0, where);
  SentencePieceModel model;
  while (!reader.done()) {
    const size_t start = reader.offset();
    const auto [field, wire] = reader.key();
    if (field == 1 || field == 2) {
      reader.expect(wire, 2, field == 1 ? "a piece" : "trainer_spec", start);
      const auto [message, at] = reader.bytes();
      if (field == 1) {
        model.pieces.push_back(read_piece(message, at, where, model.pieces.size()));
      } else {
        model.model_type = read_model_type(message, at, where);
      }
    } else {
      reader.skip(wire);
    }
  }
  KUAFU_CHECK(!model.pieces.empty(), where, ": no pieces (", bytes.size(), " bytes); not a SentencePiece model?");
  return model;
}

SentencePieceModel read_sentencepiece_model(const std::string& path) {
  return parse_sentencepiece_model(read_file(path), path);
}

}  // namespace kuafu::io

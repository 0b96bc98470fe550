// A SentencePiece model file (tokenizer.model: Llama 2's, Mistral's, TinyLlama's), read as the pieces and
// the model type. The file is a protocol buffer (sentencepiece_model.proto's ModelProto); Debian's
// libsentencepiece reads it but does not say a piece's type (user-defined or normal) nor the model type,
// which transformers' converter needs, so the few fields used are read here from the wire format.
#pragma once

#include <string>
#include <vector>

namespace kuafu::io {

struct SentencePieceModel {
  // sentencepiece_model.proto's SentencePiece.Type.
  enum class PieceType { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };
  struct Piece {
    std::string text;  // UTF-8, "▁" for a space
    float score = 0;
    PieceType type = PieceType::Normal;
  };
  // TrainerSpec.ModelType (Unigram when the file does not say).
  enum class ModelType { Unigram = 1, Bpe = 2, Word = 3, Char = 4 };

  std::vector<Piece> pieces;  // by id
  ModelType model_type = ModelType::Unigram;
};

// kuafu::Error naming `path` and the byte offset for a file that is not such a model (truncated, a field of
// the wrong kind, a piece that is not UTF-8, no pieces).
SentencePieceModel read_sentencepiece_model(const std::string& path);

// The same from the file's bytes; `where` names them in errors.
SentencePieceModel parse_sentencepiece_model(const std::string& bytes, const std::string& where);

}  // namespace kuafu::io

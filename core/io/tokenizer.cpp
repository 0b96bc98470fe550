#include "core/io/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/stat.h>

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/util/error.h"

namespace kuafu::io {

namespace {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

struct Tokenizer::Model {
  sentencepiece::SentencePieceProcessor processor;
};

void train_tokenizer(const TokenizerTrainOptions& options) {
  KUAFU_CHECK(!options.input_path.empty(), "tokenizer training: input_path is empty");
  KUAFU_CHECK(!options.model_prefix.empty(), "tokenizer training: model_prefix is empty");
  KUAFU_CHECK(file_exists(options.input_path), "tokenizer training: cannot read input ", options.input_path);
  KUAFU_CHECK(options.vocab_size > 0, "tokenizer training: vocab_size must be positive, got ",
              options.vocab_size);

  // The map API rather than an argument string: the "\n" symbol and paths with spaces pass unquoted.
  const std::unordered_map<std::string, std::string> args = {
      {"input", options.input_path},
      {"model_prefix", options.model_prefix},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"model_type", options.model_type},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"byte_fallback", options.byte_fallback ? "true" : "false"},
      {"num_threads", std::to_string(options.num_threads)},
      {"input_sentence_size", std::to_string(options.input_sentence_size)},
      {"shuffle_input_sentence", "true"},
      // Exact round trip (see the header): keep every byte of the text as it is.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"user_defined_symbols", "\n"},
      {"unk_id", std::to_string(kUnkId)},
      {"bos_id", std::to_string(kBosId)},
      {"eos_id", std::to_string(kEosId)},
      {"pad_id", "-1"},
      // Progress lines and the warning that ".vocab" shows the newline piece raw, off; errors come back
      // through the returned status.
      {"minloglevel", "2"},
  };
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  KUAFU_CHECK(status.ok(), "tokenizer training on ", options.input_path, " failed: ", status.ToString());
}

Tokenizer Tokenizer::load(const std::string& model_path) {
  // SentencePiece's own messages for a missing, empty or unparsable file are vague; say what is wrong.
  struct stat st {};
  const bool found = ::stat(model_path.c_str(), &st) == 0;
  KUAFU_CHECK(found, "tokenizer model ", model_path, " does not exist");
  KUAFU_CHECK(!S_ISDIR(st.st_mode), "tokenizer model ", model_path, " is a folder, not a SentencePiece model file");
  KUAFU_CHECK(S_ISREG(st.st_mode), "tokenizer model ", model_path, " is not a regular file");
  KUAFU_CHECK(st.st_size > 0, "tokenizer model ", model_path,
              " is empty (0 bytes); run prepare again or point data.dir at a prepared folder");
  Tokenizer tokenizer;
  tokenizer.model_path_ = model_path;
  tokenizer.model_ = std::make_unique<Model>();
  const auto status = tokenizer.model_->processor.Load(model_path);
  if (!status.ok()) {
    // A failed parse reports a line of SentencePiece's source, of no use to the user.
    const std::string why = std::string(status.message()).find("ParseFromArray") != std::string::npos
                                ? "truncated, corrupt or another kind of file"
                                : std::string(status.message());
    fail(detail::concat("cannot load tokenizer model ", model_path, " (", st.st_size,
                        " bytes): it is not a SentencePiece model (", why, ")"));
  }
  // Models from train_tokenizer have a "\n" piece; for others encode() takes the general path.
  const auto& processor = tokenizer.model_->processor;
  // PieceToId gives the unknown id for a piece the model lacks.
  const int newline = processor.PieceToId("\n");
  tokenizer.newline_id_ = processor.IsUnknown(newline) ? -1 : newline;
  return tokenizer;
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<uint32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> out;
  const auto encode_piece = [&](std::string_view piece) {
    std::vector<int> ids;
    const auto status = model_->processor.Encode(piece, &ids);
    KUAFU_CHECK(status.ok(), "tokenizer ", model_path_, ": encode failed: ", status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (newline_id_ < 0) {
    encode_piece(text);
    return out;
  }
  // BPE cost grows faster than linearly with the length of one input, and no piece spans the
  // newline symbol, so encoding line by line gives the same ids, only much faster on a whole corpus.
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      encode_piece(std::string_view(text).substr(start));
      break;
    }
    if (end > start) encode_piece(std::string_view(text).substr(start, end - start));
    out.push_back(static_cast<uint32_t>(newline_id_));
    start = end + 1;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const {
  const int vocab = vocab_size();
  std::vector<int> signed_ids;
  signed_ids.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    KUAFU_CHECK(ids[i] < static_cast<uint32_t>(vocab), "tokenizer ", model_path_, ": id ", ids[i],
                " at index ", i, " >= vocab size ", vocab);
    signed_ids.push_back(static_cast<int>(ids[i]));
  }
  std::string text;
  const auto status = model_->processor.Decode(signed_ids, &text);
  KUAFU_CHECK(status.ok(), "tokenizer ", model_path_, ": decode failed: ", status.ToString());
  return text;
}

int Tokenizer::vocab_size() const { return model_->processor.GetPieceSize(); }
int Tokenizer::bos_id() const { return model_->processor.bos_id(); }
int Tokenizer::eos_id() const { return model_->processor.eos_id(); }

}  // namespace kuafu::io

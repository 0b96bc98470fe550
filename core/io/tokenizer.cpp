#include "core/io/tokenizer.h"

#include <sys/stat.h>

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/io/sentencepiece_loader.h"
#include "core/util/error.h"

namespace kuafu::io {

namespace {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Owns one buffer the bridge allocated (an error message, ids or text) and frees it through the bridge.
template <typename T>
class BridgeBuffer {
 public:
  explicit BridgeBuffer(const KuafuSpmApi& api) : api_(api) {}
  BridgeBuffer(const BridgeBuffer&) = delete;
  BridgeBuffer& operator=(const BridgeBuffer&) = delete;
  ~BridgeBuffer() { api_.free_buffer(ptr_); }

  T** out() { return &ptr_; }
  T* get() const { return ptr_; }

 private:
  const KuafuSpmApi& api_;
  T* ptr_ = nullptr;
};

// Takes a bridge call's result: "" on success, else the message (and frees it).
std::string take_error(const KuafuSpmApi& api, char* error) {
  BridgeBuffer<char> owned(api);
  *owned.out() = error;
  return error != nullptr ? std::string(error) : std::string();
}

}  // namespace

struct Tokenizer::Model {
  Model(const KuafuSpmApi& api_, KuafuSpmModel* handle_) : api(api_), handle(handle_) {}
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model() { api.free_model(handle); }

  const KuafuSpmApi& api;
  KuafuSpmModel* handle;
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
  std::vector<const char*> keys;
  std::vector<const char*> values;
  for (const auto& [key, value] : args) {
    keys.push_back(key.c_str());
    values.push_back(value.c_str());
  }
  const KuafuSpmApi& api = sentencepiece_bridge();
  const std::string error = take_error(api, api.train(keys.data(), values.data(), keys.size()));
  KUAFU_CHECK(error.empty(), "tokenizer training on ", options.input_path, " failed: ", error);
}

Tokenizer Tokenizer::load(const std::string& model_path) {
  // SentencePiece's own message for a missing file is vague; say which file.
  KUAFU_CHECK(file_exists(model_path), "tokenizer model ", model_path, " does not exist");
  Tokenizer tokenizer;
  tokenizer.model_path_ = model_path;
  const KuafuSpmApi& api = sentencepiece_bridge();
  tokenizer.model_ = std::make_unique<Model>(api, nullptr);
  KuafuSpmModel*& handle = tokenizer.model_->handle;
  const std::string error = take_error(api, api.load(model_path.c_str(), &handle));
  KUAFU_CHECK(error.empty() && handle != nullptr, "cannot load tokenizer model ", model_path,
              " (not a SentencePiece model?): ", error);
  // Models from train_tokenizer have a "\n" piece; for others encode() takes the general path.
  tokenizer.newline_id_ = api.piece_to_id(handle, "\n", 1);  // -1 when the model has none
  return tokenizer;
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<uint32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> out;
  const KuafuSpmApi& api = model_->api;
  const auto encode_piece = [&](std::string_view piece) {
    BridgeBuffer<int32_t> ids(api);
    size_t count = 0;
    const std::string error =
        take_error(api, api.encode(model_->handle, piece.data(), piece.size(), ids.out(), &count));
    KUAFU_CHECK(error.empty(), "tokenizer ", model_path_, ": encode failed: ", error);
    out.insert(out.end(), ids.get(), ids.get() + count);
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
  std::vector<int32_t> signed_ids;
  signed_ids.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    KUAFU_CHECK(ids[i] < static_cast<uint32_t>(vocab), "tokenizer ", model_path_, ": id ", ids[i],
                " at index ", i, " >= vocab size ", vocab);
    signed_ids.push_back(static_cast<int32_t>(ids[i]));
  }
  const KuafuSpmApi& api = model_->api;
  BridgeBuffer<char> text(api);
  size_t size = 0;
  const std::string error =
      take_error(api, api.decode(model_->handle, signed_ids.data(), signed_ids.size(), text.out(), &size));
  KUAFU_CHECK(error.empty(), "tokenizer ", model_path_, ": decode failed: ", error);
  return std::string(text.get(), size);
}

int Tokenizer::vocab_size() const { return model_->api.vocab_size(model_->handle); }
int Tokenizer::bos_id() const { return model_->api.bos_id(model_->handle); }
int Tokenizer::eos_id() const { return model_->api.eos_id(model_->handle); }

}  // namespace kuafu::io

// kuafu_spm_bridge: the only code that links SentencePiece. Built as a MODULE and dlopened by
// sentencepiece_loader.cpp; see sentencepiece_bridge.h for why and for the ownership rules.
#include "core/io/sentencepiece_bridge.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

struct KuafuSpmModel {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

static_assert(sizeof(int) == sizeof(int32_t), "SentencePiece ids are int; the C interface uses int32_t");

// Returned when even the error message cannot be allocated; free_buffer leaves it alone.
char kOutOfMemory[] = "out of memory in the SentencePiece bridge";

// A malloc'd copy of prefix + text[0, size) plus a NUL, or nullptr when out of memory.
char* malloc_copy(const char* prefix, const char* text, size_t size) noexcept {
  const size_t prefix_size = std::strlen(prefix);
  auto* out = static_cast<char*>(std::malloc(prefix_size + size + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, prefix, prefix_size);
  std::memcpy(out + prefix_size, text, size);
  out[prefix_size + size] = '\0';
  return out;
}

char* error_message(const char* prefix, const char* text, size_t size) noexcept {
  char* out = malloc_copy(prefix, text, size);
  return out != nullptr ? out : kOutOfMemory;
}

char* error_message(const char* prefix, const char* text) noexcept {
  return error_message(prefix, text, std::strlen(text));
}

// Runs `body` (returning an error or nullptr) and turns any exception into an error.
template <typename Body>
char* guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return kOutOfMemory;
  } catch (const std::exception& e) {
    return error_message("exception in SentencePiece: ", e.what());
  } catch (...) {
    return error_message("unknown exception in SentencePiece", "");
  }
}

char* status_error(const sentencepiece::util::Status& status) {
  if (status.ok()) return nullptr;
  const std::string message = status.ToString();
  return error_message("", message.data(), message.size());
}

char* bridge_train(const char* const* keys, const char* const* values, size_t count) {
  return guarded([&]() -> char* {
    std::unordered_map<std::string, std::string> args;
    for (size_t i = 0; i < count; ++i) args[keys[i]] = values[i];
    return status_error(sentencepiece::SentencePieceTrainer::Train(args));
  });
}

void bridge_free_model(KuafuSpmModel* model) {
  delete model;  // the processor's destructor does not throw
}

char* bridge_load(const char* model_path, KuafuSpmModel** model_out) {
  *model_out = nullptr;
  return guarded([&]() -> char* {
    auto model = std::make_unique<KuafuSpmModel>();
    const auto status = model->processor.Load(model_path);
    if (!status.ok()) return status_error(status);
    *model_out = model.release();
    return nullptr;
  });
}

char* bridge_encode(const KuafuSpmModel* model, const char* text, size_t size, int32_t** ids_out,
                    size_t* count_out) {
  *ids_out = nullptr;
  *count_out = 0;
  return guarded([&]() -> char* {
    std::vector<int> ids;
    const auto status = model->processor.Encode(absl::string_view(text, size), &ids);
    if (!status.ok()) return status_error(status);
    if (ids.empty()) return nullptr;
    auto* out = static_cast<int32_t*>(std::malloc(ids.size() * sizeof(int32_t)));
    if (out == nullptr) return kOutOfMemory;
    std::memcpy(out, ids.data(), ids.size() * sizeof(int32_t));
    *ids_out = out;
    *count_out = ids.size();
    return nullptr;
  });
}

char* bridge_decode(const KuafuSpmModel* model, const int32_t* ids, size_t count, char** text_out,
                    size_t* size_out) {
  *text_out = nullptr;
  *size_out = 0;
  return guarded([&]() -> char* {
    const std::vector<int> signed_ids(ids, ids + count);
    std::string text;
    const auto status = model->processor.Decode(signed_ids, &text);
    if (!status.ok()) return status_error(status);
    char* out = malloc_copy("", text.data(), text.size());
    if (out == nullptr) return kOutOfMemory;
    *text_out = out;
    *size_out = text.size();
    return nullptr;
  });
}

int32_t bridge_piece_to_id(const KuafuSpmModel* model, const char* piece, size_t size) {
  try {
    const int id = model->processor.PieceToId(absl::string_view(piece, size));
    return model->processor.IsUnknown(id) ? -1 : id;
  } catch (...) {
    return -1;
  }
}

int32_t bridge_vocab_size(const KuafuSpmModel* model) { return model->processor.GetPieceSize(); }
int32_t bridge_bos_id(const KuafuSpmModel* model) { return model->processor.bos_id(); }
int32_t bridge_eos_id(const KuafuSpmModel* model) { return model->processor.eos_id(); }

void bridge_free_buffer(void* buffer) {
  if (buffer != kOutOfMemory) std::free(buffer);
}

constexpr KuafuSpmApi kApi = {
    KUAFU_SPM_API_VERSION,
    sizeof(KuafuSpmApi),
    bridge_train,
    bridge_load,
    bridge_free_model,
    bridge_encode,
    bridge_decode,
    bridge_piece_to_id,
    bridge_vocab_size,
    bridge_bos_id,
    bridge_eos_id,
    bridge_free_buffer,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const KuafuSpmApi* kuafu_spm_bridge_api(
    uint32_t version) {
  return version == KUAFU_SPM_API_VERSION ? &kApi : nullptr;
}

// The C interface of kuafu_spm_bridge, the module that holds SentencePiece away from the rest of the
// process. Debian's libsentencepiece bundles protobuf-lite and exports its symbols; loaded next to
// LibTorch's libprotobuf they interpose on each other and crash in static initialisers. So nothing
// links SentencePiece directly: sentencepiece_loader.cpp dlopens this bridge with RTLD_LOCAL |
// RTLD_DEEPBIND, and everything crosses through the function table below (plain C types only).
//
// Ownership: a fallible call returns NULL on success or an error message; every pointer the bridge
// hands out (messages, id arrays, decoded text) is malloc'd by the bridge and released with
// free_buffer. Models come from load and go back through free_model. No exception crosses.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bumped on any change to KuafuSpmApi; the loader refuses a bridge of another version.
#define KUAFU_SPM_API_VERSION 1u
// The one symbol the bridge exports: const KuafuSpmApi* kuafu_spm_bridge_api(uint32_t version),
// which returns NULL when it does not implement `version`.
#define KUAFU_SPM_API_SYMBOL "kuafu_spm_bridge_api"

typedef struct KuafuSpmModel KuafuSpmModel;  // an opaque loaded SentencePiece model

typedef struct KuafuSpmApi {
  uint32_t version;      // KUAFU_SPM_API_VERSION
  uint32_t struct_size;  // sizeof(KuafuSpmApi) as the bridge was built

  // SentencePieceTrainer::Train with `count` key/value flags (the map API: values pass unquoted).
  char* (*train)(const char* const* keys, const char* const* values, size_t count);

  // On success *model_out is a model to release with free_model; on failure it is NULL.
  char* (*load)(const char* model_path, KuafuSpmModel** model_out);
  void (*free_model)(KuafuSpmModel* model);

  // Encodes text[0, size) into *ids_out (*count_out ids; NULL when there are none).
  char* (*encode)(const KuafuSpmModel* model, const char* text, size_t size, int32_t** ids_out,
                  size_t* count_out);
  // Decodes ids into *text_out (*size_out bytes plus a terminating NUL; never NULL on success).
  char* (*decode)(const KuafuSpmModel* model, const int32_t* ids, size_t count, char** text_out,
                  size_t* size_out);

  // The id of the piece piece[0, size), or -1 when the model does not have it.
  int32_t (*piece_to_id)(const KuafuSpmModel* model, const char* piece, size_t size);
  int32_t (*vocab_size)(const KuafuSpmModel* model);
  int32_t (*bos_id)(const KuafuSpmModel* model);
  int32_t (*eos_id)(const KuafuSpmModel* model);

  // Releases anything above that the bridge allocated; NULL is a no-op.
  void (*free_buffer)(void* buffer);
} KuafuSpmApi;

// Defined only in the bridge; the loader looks it up with dlsym as a KuafuSpmApiEntry.
const KuafuSpmApi* kuafu_spm_bridge_api(uint32_t version);
typedef const KuafuSpmApi* (*KuafuSpmApiEntry)(uint32_t version);

#ifdef __cplusplus
}
#endif

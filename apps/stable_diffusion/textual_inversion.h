// Textual inversion (model.train = "textual_inversion", diffusers' textual_inversion.py): a new concept's
// token embeddings learnt from a handful of images, everything of the pipeline frozen. The concept's
// tokens (textual_inversion.token, its vectors token_1 ...) join the tokenizer(s); each vector starts as
// the embedding of textual_inversion.initializer; each training row is captioned by a template naming the
// concept (textual_inversion.captions = "templates") or by its image's own caption with "{}" where the
// concept goes ("images", as kohya's scripts caption). `export --out DIR` writes DIR/learned_embeds.safetensors, which diffusers'
// load_textual_inversion and `kuafu-sd sample --embedding` read.
#pragma once

#include <memory>

#include "core/config/config.h"
#include "core/train/app.h"

namespace kuafu::sd {

std::unique_ptr<train::App> make_textual_inversion_app(const config::Config& config);

}  // namespace kuafu::sd

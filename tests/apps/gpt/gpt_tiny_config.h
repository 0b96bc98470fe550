// The tiny GPT-2 shape the model tests build directly (no config file).
#pragma once

#include "apps/gpt/model.h"

namespace kuafu::gpt {

inline GPTConfig tiny_gpt_config(int64_t layers = 2) {
  GPTConfig c;
  c.vocab_size = 50;
  c.n_positions = 16;
  c.n_embd = 32;
  c.n_layer = layers;
  c.n_head = 4;
  return c;
}

}  // namespace kuafu::gpt

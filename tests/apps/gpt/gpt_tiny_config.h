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

// The same with a vocabulary of 64, which the tensor- and sequence-parallel ranks divide.
inline GPTConfig tiny_parallel_gpt_config() {
  GPTConfig c = tiny_gpt_config();
  c.vocab_size = 64;
  return c;
}

}  // namespace kuafu::gpt

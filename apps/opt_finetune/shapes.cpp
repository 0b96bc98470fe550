#include "apps/opt_finetune/shapes.h"

#include "core/util/error.h"

namespace kuafu::opt {

namespace {

struct Shape {
  const char* name;
  int64_t hidden, layers, heads;
};

// ffn_dim is 4 x hidden in every published shape.
constexpr Shape kShapes[] = {
    {"125m", 768, 12, 12},   {"350m", 1024, 24, 16},  {"1.3b", 2048, 24, 32}, {"2.7b", 2560, 32, 32},
    {"6.7b", 4096, 32, 32},  {"13b", 5120, 40, 40},   {"30b", 7168, 48, 56},  {"66b", 9216, 64, 72},
};

}  // namespace

std::vector<std::string> opt_shape_names() {
  std::vector<std::string> names;
  for (const Shape& s : kShapes) names.emplace_back(s.name);
  return names;
}

OPTConfig opt_shape(const std::string& name) {
  for (const Shape& s : kShapes) {
    if (name != s.name) continue;
    OPTConfig c;
    c.vocab_size = 50272;
    c.max_position_embeddings = 2048;
    c.hidden_size = s.hidden;
    c.num_hidden_layers = s.layers;
    c.num_attention_heads = s.heads;
    c.ffn_dim = 4 * s.hidden;
    c.word_embed_proj_dim = s.hidden;
    if (name == "350m") {  // the one post-LN shape, with a narrower embedding projected in and out
      c.do_layer_norm_before = false;
      c.word_embed_proj_dim = 512;
    }
    return c;
  }
  std::string known;
  for (const Shape& s : kShapes) known += std::string(known.empty() ? "" : ", ") + s.name;
  fail("unknown OPT shape \"" + name + "\"; the shapes are " + known);
}

}  // namespace kuafu::opt

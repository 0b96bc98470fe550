#include "apps/stable_diffusion/textual_inversion_file.h"

#include <filesystem>

#include "core/util/error.h"

namespace kuafu::sd {

namespace {

// `rows` [n, D] ([D]: one vector) as encoder `encoder` takes them, after its `added` rows.
torch::Tensor appended(const torch::Tensor& added, torch::Tensor rows, ClipTextModel& encoder, const std::string& what) {
  if (rows.dim() == 1) rows = rows.unsqueeze(0);
  KUAFU_CHECK(rows.dim() == 2 && rows.size(0) >= 1 && rows.size(1) == encoder->config.hidden_size, what, ": embeddings of shape ",
              rows.sizes(), " do not fit a text encoder of width ", encoder->config.hidden_size, " ([n, ", encoder->config.hidden_size,
              "] wanted)");
  const torch::Tensor weight = encoder->embeddings->token_embedding->parameters().front();
  rows = rows.to(weight.device(), weight.scalar_type());
  return added.defined() ? torch::cat({added, rows}) : rows;
}

}  // namespace

void add_concept(Pipeline& p, const std::string& token, const torch::Tensor& rows, const torch::Tensor& rows_2) {
  KUAFU_CHECK(p.sdxl() == rows_2.defined(), "concept ", token, ": ",
              p.sdxl() ? "an SDXL pipeline needs embeddings for both text encoders (clip_l and clip_g)"
                       : "this pipeline has one text encoder, but embeddings for two were given");
  const std::string what = "concept " + token;
  const torch::Tensor first = appended(p.added_token_rows, rows, p.text_encoder, what);
  const int64_t vectors = first.size(0) - (p.added_token_rows.defined() ? p.added_token_rows.size(0) : 0);
  torch::Tensor second;
  if (p.sdxl()) {
    second = appended(p.added_token_rows_2, rows_2, p.text_encoder_2, what);
    KUAFU_CHECK(second.size(0) == first.size(0), what, ": ", vectors, " vectors for the first text encoder but ",
                second.size(0) - first.size(0) + vectors, " for the second");
  }
  // The ids the tokenizers give must be the rows' places past each encoder's vocabulary.
  const std::vector<int64_t> ids = p.tokenizer.add_concept(token, vectors);
  KUAFU_CHECK(ids.back() == p.text_encoder->config.vocab_size + first.size(0) - 1, what, ": the tokenizer's ", ids.front(),
              ".. do not follow the text encoder's vocabulary of ", p.text_encoder->config.vocab_size, " and its ",
              first.size(0) - vectors, " added tokens (a tokenizer and text encoder of different sizes)");
  if (p.sdxl()) {
    const std::vector<int64_t> ids_2 = p.tokenizer_2.add_concept(token, vectors);
    KUAFU_CHECK(ids_2.back() == p.text_encoder_2->config.vocab_size + second.size(0) - 1, what,
                ": the second tokenizer's ids do not follow the second text encoder's vocabulary");
  }
  p.added_token_rows = first;
  p.added_token_rows_2 = second;
}

std::string load_textual_inversion(Pipeline& p, const std::string& path, std::string token) {
  const io::SafetensorsFile file = io::load_safetensors(path);
  const auto named = [&](const char* key) {
    const torch::Tensor* t = file.find(key);
    return t ? *t : torch::Tensor();
  };
  const std::string stem = std::filesystem::path(path).stem().string();
  torch::Tensor rows, rows_2;
  if (named("clip_l").defined() || named("clip_g").defined()) {
    rows = named("clip_l");
    rows_2 = named("clip_g");
    KUAFU_CHECK(rows.defined() && rows_2.defined(), path, ": an SDXL embedding needs both clip_l and clip_g");
    KUAFU_CHECK(p.sdxl(), path, ": an SDXL embedding (clip_l, clip_g) for a pipeline with one text encoder");
    if (token.empty()) token = stem;
  } else if (named("emb_params").defined()) {
    rows = named("emb_params");
    if (token.empty()) token = stem;
  } else {
    KUAFU_CHECK(file.tensors.size() == 1, path, ": not a textual-inversion embedding: ", file.tensors.size(),
                " tensors, none named clip_l/clip_g or emb_params (diffusers' files hold one, named by its token)");
    rows = file.tensors.front().second;
    if (token.empty()) token = file.tensors.front().first;
  }
  KUAFU_CHECK(!p.sdxl() || rows_2.defined(), path, ": an SDXL pipeline needs the embedding for both text encoders (clip_l and clip_g)");
  try {
    add_concept(p, token, rows.to(torch::kFloat32), rows_2.defined() ? rows_2.to(torch::kFloat32) : rows_2);
  } catch (const Error& e) {
    fail(path + ": " + e.what());
  }
  return token;
}

io::NamedTensors textual_inversion_tensors(const std::string& token, const torch::Tensor& rows, const torch::Tensor& rows_2) {
  const auto cpu = [](const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat32).contiguous(); };
  if (rows_2.defined()) return {{"clip_g", cpu(rows_2)}, {"clip_l", cpu(rows)}};
  return {{token, cpu(rows)}};
}

}  // namespace kuafu::sd

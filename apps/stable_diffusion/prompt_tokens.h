// A prompt as CLIP's text encoder reads it, as transformers' tokenizer(prompt, padding="max_length",
// max_length=77, truncation=True) gives it: <|startoftext|>, the prompt's tokens cut to fit,
// <|endoftext|>, then the folder's pad token (SD 1.x pads with <|endoftext|>, SD 2.x with "!"). Textual
// inversion's concepts are tokens added after the vocabulary (transformers' add_tokens).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/io/bpe_tokenizer.h"

namespace kuafu::sd {

class PromptTokenizer {
 public:
  // A CLIPTokenizer folder (vocab.json, merges.txt, tokenizer_config.json naming CLIPTokenizer): its pad
  // token and model_max_length from tokenizer_config.json / special_tokens_map.json. kuafu::Error naming
  // the folder and what it lacks.
  static PromptTokenizer from_folder(const std::string& dir);

  std::vector<int64_t> encode(const std::string& prompt) const;         // [max_length]
  torch::Tensor encode(const std::vector<std::string>& prompts) const;  // [B, max_length] int64
  int64_t max_length() const { return max_length_; }
  const io::BpeTokenizer& bpe() const { return *bpe_; }

  // A textual-inversion concept of `vectors` tokens: `token` and, past one vector, token_1 .. token_<vectors-1>
  // (diffusers' names), given the ids after the vocabulary's and every token added before, which it returns.
  // A prompt's `token` reads as all of them (diffusers' pipelines expand it so), token_<i> as its own; the
  // tokens are matched whole before BPE, the longest first and regardless of case (CLIP lower-cases the
  // prompt and the tokens alike). kuafu::Error naming the token when it, or a token of its names, is
  // already known, or when it is empty or holds a space.
  std::vector<int64_t> add_concept(const std::string& token, int64_t vectors);
  int64_t vocab_size() const;  // the vocabulary's tokens and the added ones (transformers' len(tokenizer))

 private:
  // The words' ids of a prompt without BOS and EOS: its added tokens matched, the text between them BPE's.
  std::vector<int64_t> word_ids(const std::string& prompt) const;

  struct AddedToken {
    std::string lower_text;    // matched in the lower-cased prompt
    std::vector<int64_t> ids;  // what it reads as
  };
  std::shared_ptr<const io::BpeTokenizer> bpe_;
  std::vector<AddedToken> added_;
  int64_t added_count_ = 0;  // ids given to added tokens
  int64_t bos_ = 0, eos_ = 0, pad_ = 0, max_length_ = 77;
};

}  // namespace kuafu::sd

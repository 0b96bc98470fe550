// A prompt as CLIP's text encoder reads it, as transformers' tokenizer(prompt, padding="max_length",
// max_length=77, truncation=True) gives it: <|startoftext|>, the prompt's tokens cut to fit,
// <|endoftext|>, then the folder's pad token (SD 1.x pads with <|endoftext|>, SD 2.x with "!").
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

 private:
  std::shared_ptr<const io::BpeTokenizer> bpe_;
  int64_t bos_ = 0, eos_ = 0, pad_ = 0, max_length_ = 77;
};

}  // namespace kuafu::sd

#include "apps/chat_rlhf/scored_model.h"

#include "apps/opt_finetune/hugging_face.h"
#include "core/io/hf_folder.h"

namespace kuafu::chat {

namespace {

const char* const kScoreTail = "score.head";

}  // namespace

ScoredModelImpl::ScoredModelImpl(const opt::OPTConfig& c, parallel::ModelOptions options)
    : config(c), tp(options.tp), lm(c, options) {
  add_score_head(options.device);
}

ScoredModelImpl::ScoredModelImpl(opt::OPTForCausalLM trunk) : config(trunk->config), tp(trunk->tp), lm(std::move(trunk)) {
  add_score_head(lm->parameters().front().device());
}

void ScoredModelImpl::add_score_head(const torch::Device& device) {
  register_module("model", lm->named_children()["model"]);
  score = register_module("score", torch::nn::Linear(torch::nn::LinearOptions(config.word_embed_proj_dim, 1).bias(false)));
  score->to(device);
  {
    torch::NoGradGuard no_grad;
    score->weight.normal_(0.0, 0.02);  // Hugging Face's init_std
  }
  std::vector<hooks::ModelPart> parts = {lm->head_part()};
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) parts.push_back(lm->block_part(i));
  hooks::ModelPart tail{kScoreTail, {"score"}};
  for (const std::string& path : lm->tail_part().modules) {
    if (path != "model.decoder.embed_tokens") tail.modules.push_back(path);  // the tied output layer is not read
  }
  parts.push_back(tail);
  sites_ = hooks::BlockSites::of_parts(*this, parts);
}

torch::Tensor ScoredModelImpl::values(const torch::Tensor& tokens, const torch::Tensor& real) {
  return nn::decode_through_sites(
      sites_, lm->head_part().name, kScoreTail, lm->decoder->blocks, nn::whole_rows_step(tokens, real), nullptr,
      [&](const nn::DecodeStep& s) { return lm->embed(s.tokens, s.positions); },
      [&](const torch::Tensor& x) {
        const torch::Tensor hidden = lm->final_projection(x);                  // [B, T, D]
        return score(hidden.to(score->weight.scalar_type())).squeeze(-1);  // [B, T]
      });
}

torch::Tensor ScoredModelImpl::scores(const torch::Tensor& tokens, const torch::Tensor& real) {
  return values(tokens, real).gather(1, last_real_token(real).unsqueeze(1)).squeeze(1);
}

torch::Tensor last_real_token(const torch::Tensor& real) {
  const torch::Tensor index = torch::arange(real.size(1), real.options().dtype(torch::kInt64));
  return (index * real.to(torch::kInt64)).argmax(1);
}

const ScoredFormat& scored_format() {
  static const ScoredFormat format = [] {
    const opt::OptFormat& causal = opt::opt_format();
    nlohmann::json constants = causal.constants;
    constants["architectures"] = {"OPTForSequenceClassification"};
    constants["id2label"] = {{"0", "LABEL_0"}};
    constants["label2id"] = {{"LABEL_0", 0}};
    auto finish = [check = causal.finish](const nlohmann::json& json, const std::string& where, opt::OPTConfig& c) {
      check(json, where, c);
      if (json.contains("id2label")) {
        KUAFU_CHECK(json["id2label"].size() == 1, where, ": id2label has ", json["id2label"].size(),
                    " labels; a reward or value model has one (num_labels = 1)");
      }
    };
    return ScoredFormat{"opt", "OPT", causal.numbers, constants, finish, {"model.", {"score."}, {}, {}, "", "", {}}, causal.bounds};
  }();
  return format;
}

bool load_scored_weights(ScoredModel& model, const std::string& dir) {
  const io::HfFolder folder = io::read_hf_folder(dir);
  bool classifier = false;
  if (folder.config.contains("architectures") && folder.config["architectures"].is_array()) {
    for (const auto& a : folder.config["architectures"]) classifier |= a == "OPTForSequenceClassification";
  }
  if (classifier) {
    scored_format().load_weights(model, folder);
    return true;
  }
  // A causal language model: its decoder, its tied head dropped, the score head new.
  train::HfWeightNames names = opt::opt_format().names;
  names.fresh_prefixes = {"score."};
  train::load_pretrained(*model, model->tp, folder, names);
  return false;
}

}  // namespace kuafu::chat

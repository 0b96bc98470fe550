#include "apps/chat_rlhf/scored_model.h"

#include <algorithm>

#include "core/io/hf_folder.h"
#include "core/nn/language_model.h"
#include "core/train/lazy_model.h"
#include "core/util/device.h"

namespace kuafu::chat {

namespace {

const char* const kScoreTail = "score.head";

// The trunk's names, and the head's kept as stored.
train::HfWeightNames scored_names(const opt::LmShape& shape) {
  train::HfWeightNames names = opt::lm_weight_names(shape);
  names.own_prefixes.push_back("score.");
  return names;
}

}  // namespace

ScoredModelImpl::ScoredModelImpl(const opt::LmShape& s, parallel::ModelOptions options)
    : ScoredModelImpl(s.build(options), options.device) {}

ScoredModelImpl::ScoredModelImpl(nn::CausalLMPtr trunk, const torch::Device& device, bool reads_logits)
    : shape(opt::shape_of(*trunk)), lm(std::move(trunk)), tp(lm->tp), reads_logits_(reads_logits) {
  // The trunk's modules; an untied output layer (Llama's lm_head) only where the logits are read here.
  const std::vector<std::string> lm_tail = lm->tail_part().modules, final_modules = lm->final_modules();
  for (const auto& child : lm->module().named_children()) {
    const bool output_only = std::count(lm_tail.begin(), lm_tail.end(), child.key()) > 0 &&
                             std::count(final_modules.begin(), final_modules.end(), child.key()) == 0;
    if (output_only && !reads_logits) {
      left_out.push_back(child.key());
      continue;
    }
    register_module(child.key(), child.value());
  }
  score = register_module("score", parallel::SerialLinear(parallel::LinearSpec{lm->final_width(), 1, /*bias=*/false}, device));
  if (!device.is_meta()) {
    torch::NoGradGuard no_grad;
    score->weight.normal_(0.0, 0.02);  // Hugging Face's initializer range
  }
  std::vector<hooks::ModelPart> parts = {lm->head_part()};
  for (int64_t i = 0; i < lm->num_blocks(); ++i) parts.push_back(lm->block_part(i));
  hooks::ModelPart tail{kScoreTail, {"score"}};
  // The tied output layer only where the logits are read here too.
  for (const std::string& path : reads_logits ? lm->tail_part().modules : lm->final_modules()) tail.modules.push_back(path);
  parts.push_back(tail);
  sites_ = hooks::BlockSites::of_parts(*this, parts);
}

void ScoredModelImpl::initialize() {
  lm->initialize();
  torch::nn::Module head;  // the head under its name in this model, as a WeightSink knows it
  head.register_module("score", score);
  parallel::initialize_like_serial(head, tp, [](const std::string&, torch::Tensor& full) {
    full.normal_(0.0, 0.02);
    return true;
  });
}

torch::Tensor ScoredModelImpl::through_sites(const torch::Tensor& tokens, const torch::Tensor& real,
                                             const std::function<torch::Tensor(const torch::Tensor&)>& tail) {
  return nn::decode_through_sites(
      sites_, lm->head_part().name, kScoreTail, lm->layers(), nn::whole_rows_step(tokens, real), nullptr,
      [&](const nn::DecodeStep& s) { return lm->embed_at(s.tokens, s.positions); }, tail);
}

torch::Tensor ScoredModelImpl::head_values(const torch::Tensor& x) {
  const torch::Tensor hidden = lm->final_hidden(x);                   // [B, T, D]
  return score(hidden.to(score->weight.scalar_type())).squeeze(-1);  // [B, T]
}

torch::Tensor ScoredModelImpl::values(const torch::Tensor& tokens, const torch::Tensor& real) {
  return through_sites(tokens, real, [&](const torch::Tensor& x) { return head_values(x); });
}

ScoredModelImpl::ValuesAndLogits ScoredModelImpl::values_and_logits(const torch::Tensor& tokens, const torch::Tensor& real) {
  KUAFU_CHECK(reads_logits_, "values_and_logits needs a scored model built to read the trunk's logits");
  // Both leave the tail site as one tensor [B, T, V + 1], so that its hooks (Gemini's backward gathers)
  // see every output.
  const torch::Tensor both = through_sites(tokens, real, [&](const torch::Tensor& x) {
    const torch::Tensor logits = lm->output_logits(x);  // [B, T, V]
    return torch::cat({logits, head_values(x).to(logits.scalar_type()).unsqueeze(-1)}, -1);
  });
  const int64_t vocab = both.size(-1) - 1;
  return {both.select(-1, vocab), both.narrow(-1, 0, vocab)};
}

torch::Tensor ScoredModelImpl::scores(const torch::Tensor& tokens, const torch::Tensor& real) {
  return values(tokens, real).gather(1, last_real_token(real).unsqueeze(1)).squeeze(1);
}

torch::Tensor last_real_token(const torch::Tensor& real) {
  const torch::Tensor index = torch::arange(real.size(1), real.options().dtype(torch::kInt64));
  return (index * real.to(torch::kInt64)).argmax(1);
}

opt::LmShape read_scored_shape(const nlohmann::json& config, const std::string& where) {
  if (config.contains("id2label")) {
    KUAFU_CHECK(config["id2label"].size() == 1, where, ": id2label has ", config["id2label"].size(),
                " labels; a reward or value model has one (num_labels = 1)");
  }
  return opt::read_lm_shape(config, where);
}

ScoredModel load_scored_model(const std::string& dir, torch::Device device, torch::Dtype dtype) {
  return load_scored_model(dir, train::Materialization::all_in(device, dtype));
}

train::ModelRecipe<ScoredModel> scored_folder_recipe(const std::string& dir, const std::string& name) {
  train::ModelRecipe<ScoredModel> recipe{name, /*trained=*/false};
  const opt::LmShape shape = read_scored_shape(io::read_hf_config(dir), dir + "/config.json");
  recipe.describe = train::described<ScoredModel>(shape);
  recipe.parameters = static_cast<double>(shape.parameter_count());
  // As opt::causal_lm_folder_recipe: every weight (the head's too) read, nothing drawn.
  recipe.draw = [dir](ScoredModel& model) {
    train::load_pretrained(*model, model->tp, io::read_hf_folder(dir), scored_names(model->shape));
  };
  return recipe;
}

ScoredModel load_scored_model(const std::string& dir, const train::Materialization& how) {
  return train::build_as(scored_folder_recipe(dir), how);
}

void save_scored_model(ScoredModel& model, const std::string& dir, const io::HfWriteOptions& options) {
  nlohmann::json config = opt::write_lm_config(model->shape);
  config["architectures"] = {model->shape.classifier_architecture()};
  config["id2label"] = {{"0", "LABEL_0"}};
  config["label2id"] = {{"LABEL_0", 0}};
  train::export_pretrained(*model, model->tp, dir, config, options);
}

bool load_scored_weights(ScoredModel& model, const std::string& dir) {
  const io::HfFolder folder = io::read_hf_folder(dir);
  bool classifier = false;
  if (folder.config.contains("architectures") && folder.config["architectures"].is_array()) {
    for (const auto& a : folder.config["architectures"]) classifier |= a == model->shape.classifier_architecture();
  }
  train::HfWeightNames names = scored_names(model->shape);
  // A causal language model: its trunk, its tied head dropped (an untied one too unless the logits are
  // read here), the score head new.
  if (!classifier) {
    names.fresh_prefixes = {"score."};
    for (const std::string& module : model->left_out) names.dropped_prefixes.push_back(module + ".");
  }
  train::load_pretrained(*model, model->tp, folder, names);
  return classifier;
}

}  // namespace kuafu::chat

// kuafu-gpt's subcommands: prepare (tokenizer + token files), train, eval, generate, benchmark.
// Each takes the validated config; run_gpt_app parses the command line and catches errors.
#pragma once

#include <string>

#include "apps/gpt/app_config.h"
#include "core/io/token_loader.h"
#include "core/parallel/pipeline/engine.h"
#include "core/train/trainer.h"

namespace kuafu::gpt {

// Language modelling on token files: the trainer's view of a GPT and its data.
class TextTask : public train::TrainTask {
 public:
  // A pipeline stage's engines and groups (absent without pipeline parallelism).
  struct Pipeline {
    std::unique_ptr<parallel::pipeline::PipelineEngine> train, eval;  // eval: one micro-batch at a time
    dist::GroupPtr ends;  // the first and last stage, which hold the tied embedding (null elsewhere)
  };

  TextTask(GPT model, std::shared_ptr<io::TokenWindowLoader> train, std::shared_ptr<io::TokenWindowLoader> val,
           int64_t eval_rows, int64_t micro_batch, std::unique_ptr<Pipeline> pipeline = nullptr);
  torch::nn::Module& model() override { return *model_; }
  torch::Tensor loss(int64_t step, int64_t first_row, int64_t rows) override;
  train::LossSum evaluate(int rank, int ranks) override;
  double flops_per_item() const override;
  int64_t items_per_row() const override { return train_->context(); }
  std::vector<std::string> checkpoint_keys() const override { return {"model."}; }
  bool pipelined() const override { return pipeline_ != nullptr; }
  double pipeline_step(int64_t step, const std::vector<int64_t>& first_rows, int64_t rows, double loss_scale) override;
  bool counts_in_global_norm(const std::string& name) const override;
  bool set_block_hooks(nn::BlockHooks* hooks) override {
    model_->block_hooks = hooks;
    return true;
  }
  GPT& gpt() { return model_; }

 private:
  // What this pipeline rank runs for a micro-batch's chunk: embeddings first, its layers, the loss last.
  torch::Tensor stage_forward(int chunk, const torch::Tensor& input, const torch::Tensor& targets);
  // The model's mean loss on a whole batch (under sequence parallelism, averaged over the chunks).
  double model_loss_mean(const io::TokenBatch& batch);
  torch::Device device() const;  // where the model's weights are: batches go there

  GPT model_;
  std::shared_ptr<io::TokenWindowLoader> train_, val_;
  int64_t eval_rows_;
  int64_t micro_batch_;
  std::unique_ptr<Pipeline> pipeline_;
};

// Builds the model and data of a config (seeded from train.seed) for train and eval.
// The GPT and its data from the config; `tp` cuts the model's layers (default: serial).
std::unique_ptr<TextTask> make_text_task(const config::Config& config, const parallel::TensorParallel& tp = {});
// The same laid out on a runtime's mesh: tensor parallelism, and this rank's pipeline stage with its
// schedule over the step's accumulation micro-batches.
std::unique_ptr<TextTask> make_text_task(const config::Config& config, const train::Runtime& runtime);

// kuafu::Error naming model.n_layer and model.n_embd when the configured model cannot fit this machine
// (train::check_model_fits), before anything is built.
void check_model_fits(const config::Config& config, const train::Runtime& runtime);

void prepare_command(const config::Config& config);
train::TrainSummary train_command(const config::Config& config);
void eval_command(const config::Config& config, const std::string& checkpoint);
void generate_command(const config::Config& config, const std::string& checkpoint, const std::string& prompt);
void benchmark_command(const config::Config& config);

// The whole program; returns the exit code.
int run_gpt_app(int argc, const char* const argv[]);

}  // namespace kuafu::gpt

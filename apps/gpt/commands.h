// kuafu-gpt's subcommands: prepare (tokenizer + token files), train, eval, generate, export, benchmark.
// Each takes the validated config; run_gpt_app parses the command line and catches errors.
#pragma once

#include <string>

#include "apps/gpt/app_config.h"
#include "core/io/token_loader.h"
#include "core/train/model_task.h"

namespace kuafu::gpt {

// Language modelling on token files: a GPT and its data, as the trainer sees them.
class TextTask : public train::ModelTask {
 public:
  TextTask(GPT model, const train::ParallelOptions& options, std::shared_ptr<io::TokenWindowLoader> train,
           std::shared_ptr<io::TokenWindowLoader> val, int64_t eval_rows, int64_t micro_batch);
  train::Batch train_batch(int64_t step, int64_t first_row, int64_t rows) override;
  int64_t eval_rows() const override { return eval_rows_; }
  train::Batch eval_batch(int64_t first_row, int64_t rows) override;
  double flops_per_item() const override;
  int64_t items_per_row() const override { return train_->context(); }
  std::vector<std::string> checkpoint_keys() const override { return {"model."}; }
  GPT& gpt() { return model_; }

 private:
  torch::Device device() const;  // the run's device, where the model was built: batches go there

  GPT model_;
  std::shared_ptr<io::TokenWindowLoader> train_, val_;
  int64_t eval_rows_;
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
// The checkpoint (default: the latest) as a new Hugging Face folder `out`.
void export_command(const config::Config& config, const std::string& checkpoint, const std::string& out);
void generate_command(const config::Config& config, const std::string& checkpoint, const std::string& prompt);
void benchmark_command(const config::Config& config);

// The whole program; returns the exit code.
int run_gpt_app(int argc, const char* const argv[]);

}  // namespace kuafu::gpt

// The whole task of most apps: a model and a BatchSource (where its training and evaluation rows come
// from). The model stays reachable as the app's module holder, so commands and tests see its type.
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/io/token_loader.h"
#include "core/train/model_task.h"

namespace kuafu::train {

struct BatchSource {
  // Rows [first_row, first_row + rows) of step `step`'s global batch, on the model's device.
  std::function<Batch(int64_t step, int64_t first_row, int64_t rows)> train;
  // Rows of the fixed evaluation set of eval_rows rows.
  std::function<Batch(int64_t first_row, int64_t rows)> eval;
  int64_t eval_rows = 0;
  double items_per_row = 0;  // mean items (tokens) of a training row, for throughput and MFU
};

// A token batch on `device` (asynchronously through page-locked memory to a GPU).
inline Batch to_batch(const io::TokenBatch& batch, const torch::Device& device) {
  const io::TokenBatch moved = batch.to(device);
  return {moved.inputs, moved.targets};
}

// Windows of `context` tokens from two token files: training windows drawn by step from `seed`, and
// `eval_rows` evenly spaced evaluation windows. kuafu::Error telling to run `prepare` (the command line
// `prepare`) when a file is missing.
BatchSource token_file_batches(const std::string& train_path, const std::string& val_path, int64_t context,
                               uint64_t seed, int64_t eval_rows, const torch::Device& device, const std::string& prepare);

// `Model`: the app's module holder (GPT, OPTForCausalLM, ...), with its tensor-parallel layout in ->tp.
template <class Model>
class SourceTask : public ModelTask {
 public:
  struct Figures {
    double flops_per_item = 0;
    std::vector<std::string> checkpoint_keys;  // config keys a resumed run must agree on
  };

  SourceTask(Model model, const ParallelOptions& options, BatchSource batches, int64_t micro_batch, Figures figures)
      : ModelTask(std::make_unique<ParallelModel>(*model, options), micro_batch, model->tp.batch_blocks()),
        model_(std::move(model)), batches_(std::move(batches)), figures_(std::move(figures)) {}

  Batch train_batch(int64_t step, int64_t first_row, int64_t rows) override { return batches_.train(step, first_row, rows); }
  int64_t eval_rows() const override { return batches_.eval_rows; }
  Batch eval_batch(int64_t first_row, int64_t rows) override { return batches_.eval(first_row, rows); }
  double flops_per_item() const override { return figures_.flops_per_item; }
  int64_t items_per_row() const override { return std::llround(batches_.items_per_row); }
  std::vector<std::string> checkpoint_keys() const override { return figures_.checkpoint_keys; }
  Model& model_holder() { return model_; }

 private:
  Model model_;
  BatchSource batches_;
  Figures figures_;
};

}  // namespace kuafu::train

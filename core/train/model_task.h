// The trainer's view of an app whose model is a hooks::BlockModel run through a ParallelModel: the app
// supplies its data (training micro-batches by step and rows, an evaluation set by rows) and its
// figures; the loss, pipeline steps, evaluation and hooks are shared by every such app.
#pragma once

#include <memory>

#include "core/train/parallelize.h"
#include "core/train/trainer.h"

namespace kuafu::train {

class ModelTask : public TrainTask {
 public:
  // `row_block`: every batch's rows must be a multiple of it (the tensor mode's row blocks);
  // `micro_batch`: rows per evaluation batch. `row_batches`: the app's rows differ in shape and do not
  // stack (AlphaFold's crops of chains of different lengths): each row is a batch of its own, run through
  // the model alone, and a micro-step's loss is their mean.
  ModelTask(std::unique_ptr<ParallelModel> parallel, int64_t micro_batch, int64_t row_block, bool row_batches = false);

  // The app's data, on the model's device: rows [first_row, first_row + rows) of step `step`'s global
  // batch, and of the fixed evaluation set of eval_rows() rows.
  virtual Batch train_batch(int64_t step, int64_t first_row, int64_t rows) = 0;
  virtual int64_t eval_rows() const = 0;
  virtual Batch eval_batch(int64_t first_row, int64_t rows) = 0;

  torch::nn::Module& model() override { return parallel_->model().module(); }
  torch::Tensor loss(int64_t step, int64_t first_row, int64_t rows) override;
  // Each data rank takes a range of whole row blocks (rows past the last whole block are left out).
  LossSum evaluate(int rank, int ranks) override;
  bool pipelined() const override { return parallel_->pipelined(); }
  double pipeline_step(int64_t step, const std::vector<int64_t>& first_rows, int64_t rows, double loss_scale) override;
  TiedCopies tied_copies() const override { return parallel_->tied_copies(); }
  bool set_block_hooks(hooks::BlockHooks* hooks) override {
    parallel_->set_block_hooks(hooks);
    return true;
  }
  ParallelModel& parallel() { return *parallel_; }

 protected:
  int64_t micro_batch() const { return micro_batch_; }

 private:
  std::unique_ptr<ParallelModel> parallel_;
  int64_t micro_batch_, row_block_;
  bool row_batches_;
};

}  // namespace kuafu::train

#include "core/train/model_task.h"

#include <algorithm>

#include "core/util/error.h"

namespace kuafu::train {

ModelTask::ModelTask(std::unique_ptr<ParallelModel> parallel, int64_t micro_batch, int64_t row_block, bool row_batches)
    : parallel_(std::move(parallel)), micro_batch_(micro_batch), row_block_(std::max<int64_t>(1, row_block)),
      row_batches_(row_batches) {
  KUAFU_CHECK(!row_batches_ || !parallel_->pipelined(), "a pipeline's micro-batches stack their rows");
}

torch::Tensor ModelTask::loss(int64_t step, int64_t first_row, int64_t rows) {
  if (!row_batches_) return parallel_->loss(train_batch(step, first_row, rows));
  torch::Tensor total;
  for (int64_t row = first_row; row < first_row + rows; ++row) {
    const torch::Tensor loss = parallel_->loss(train_batch(step, row, 1));
    total = total.defined() ? total + loss : loss;
  }
  return total / static_cast<double>(rows);
}

double ModelTask::pipeline_step(int64_t step, const std::vector<int64_t>& first_rows, int64_t rows, double loss_scale) {
  std::vector<Batch> batches;
  for (const int64_t first : first_rows) batches.push_back(train_batch(step, first, rows));
  return parallel_->pipeline_step(batches, loss_scale);
}

LossSum ModelTask::evaluate(int rank, int ranks) {
  const int64_t units = eval_rows() / row_block_;
  const int64_t begin = row_block_ * (units * rank / ranks);
  const int64_t end = row_block_ * (units * (rank + 1) / ranks);
  LossSum sum;
  for (int64_t row = begin; row < end; row += micro_batch_) {
    const torch::Tensor sums = parallel_->evaluate(eval_batch(row, std::min(micro_batch_, end - row))).to(torch::kCPU);
    sum.loss_sum += sums[0].item<double>();
    sum.count += sums[1].item<double>();
    sum.correct += sums[2].item<double>();
  }
  return sum;
}

}  // namespace kuafu::train

#include "apps/chat_rlhf/pair_task.h"

#include <algorithm>

namespace kuafu::chat {

PairTask::PairTask(std::shared_ptr<const PreferenceSet> train, std::shared_ptr<const PreferenceSet> val,
                   const train::TrainSettings& settings, int64_t pad_id, const torch::Device& device, double parameters)
    : train_(std::move(train)), val_(std::move(val)),
      order_(static_cast<int64_t>(train_->pairs.size()), settings.batch_size, settings.seed),
      micro_batch_(settings.micro_batch_size),
      eval_pairs_(std::min<int64_t>(settings.eval_rows, static_cast<int64_t>(val_->pairs.size()))), pad_id_(pad_id),
      device_(device) {
  double tokens = 0;
  for (const PreferencePair& p : train_->pairs) tokens += static_cast<double>(p.chosen.tokens.size() + p.rejected.tokens.size());
  flops_per_pair_ = 6.0 * parameters * tokens / static_cast<double>(train_->pairs.size());
}

PairRows PairTask::train_pairs(int64_t step, int64_t first_row, int64_t rows) {
  return pair_rows(*train_, order_.rows(step, first_row, rows), pad_id_, device_);
}

void PairTask::for_each_eval_batch(int rank, int ranks, const std::function<void(const PairRows& batch)>& each) {
  const int64_t first = eval_pairs_ * rank / ranks, last = eval_pairs_ * (rank + 1) / ranks;
  for (int64_t start = first; start < last; start += micro_batch_) {
    std::vector<size_t> pairs;
    for (int64_t i = start; i < std::min(last, start + micro_batch_); ++i) pairs.push_back(static_cast<size_t>(i));
    each(pair_rows(*val_, pairs, pad_id_, device_));
  }
}

}  // namespace kuafu::chat

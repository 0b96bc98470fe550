// What the reward model's and DPO's tasks share: preference pairs drawn by step (a fresh shuffle per
// epoch, so a resumed run draws the same pairs), this rank's share of the held-out pairs in
// micro-batches, and the figures of a task whose items are pairs.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "apps/chat_rlhf/preference_data.h"
#include "core/io/epoch_order.h"
#include "core/train/train_settings.h"
#include "core/train/trainer.h"

namespace kuafu::chat {

class PairTask : public train::TrainTask {
 public:
  double flops_per_item() const override { return flops_per_pair_; }
  int64_t items_per_row() const override { return 1; }
  std::string item_name() const override { return "pairs"; }
  int64_t steps_per_epoch() const override { return order_.steps_per_epoch(); }

 protected:
  // `parameters`: the trained model's, for the FLOPs of a pair (forward and backward of both answers).
  PairTask(std::shared_ptr<const PreferenceSet> train, std::shared_ptr<const PreferenceSet> val,
           const train::TrainSettings& settings, int64_t pad_id, const torch::Device& device, double parameters);

  // Rows [first_row, first_row + rows) of step `step`'s pairs.
  PairRows train_pairs(int64_t step, int64_t first_row, int64_t rows);
  // This rank's share (`rank` of `ranks`) of the first train.eval_rows held-out pairs, a micro-batch at a time.
  void for_each_eval_batch(int rank, int ranks, const std::function<void(const PairRows& batch)>& each);

  const PreferenceSet& train_set() const { return *train_; }
  const PreferenceSet& val_set() const { return *val_; }
  int64_t pad_id() const { return pad_id_; }
  const torch::Device& device() const { return device_; }

 private:
  std::shared_ptr<const PreferenceSet> train_, val_;
  io::EpochOrder order_;
  int64_t micro_batch_, eval_pairs_, pad_id_;
  double flops_per_pair_ = 0;
  torch::Device device_;
};

}  // namespace kuafu::chat

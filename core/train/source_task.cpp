#include "core/train/source_task.h"

#include <filesystem>

#include "core/io/token_file.h"
#include "core/util/error.h"

namespace kuafu::train {

BatchSource token_file_batches(const std::string& train_path, const std::string& val_path, int64_t context,
                               uint64_t seed, int64_t eval_rows, const torch::Device& device, const std::string& prepare) {
  for (const auto& path : {train_path, val_path}) {
    KUAFU_CHECK(std::filesystem::exists(path), "token file ", path, " does not exist: run `", prepare, "` first");
  }
  auto open = [&](const std::string& path) {
    return std::make_shared<const io::TokenWindowLoader>(std::make_shared<const io::TokenFile>(io::TokenFile::open(path)),
                                                         context, seed, device);
  };
  auto train = open(train_path), val = open(val_path);
  BatchSource source;
  source.train = [train, device](int64_t step, int64_t first, int64_t rows) {
    return to_batch(train->train_batch(step, first, rows), device);
  };
  source.eval = [val, eval_rows, device](int64_t first, int64_t rows) {
    return to_batch(val->eval_batch(eval_rows, first, rows), device);
  };
  source.eval_rows = eval_rows;
  source.items_per_row = static_cast<double>(context);
  return source;
}

}  // namespace kuafu::train

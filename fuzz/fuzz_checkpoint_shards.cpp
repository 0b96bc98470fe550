// Sharded checkpoint files (core/train/checkpoint_shards): the bytes as rank 0's shard file of a
// checkpoint of one rank, opened (the pieces' places read from its metadata), then every tensor rebuilt
// whole, read as a run of elements and as a block of its last dimension cut in two (box reads,
// core/train/piece_reader), as a load under another layout reads them.
#include <torch/torch.h>

#include "core/train/checkpoint_shards.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kuafu::fuzz::Scratch scratch("checkpoint_shards");
  const std::string path = scratch.write("model.rank0.safetensors", kuafu::fuzz::as_text(data, size));
  kuafu::fuzz::expect_named_errors([&] {
    const kuafu::train::SavedTensors saved(std::filesystem::path(path).parent_path().string(), "", "model");
    for (const std::string& name : saved.names()) {
      const torch::Tensor whole = saved.read(name);
      kuafu::train::PiecePlace run;
      run.shape = saved.shape(name);
      saved.read_piece(name, run, whole.numel() / 2);
      if (!run.shape.empty() && run.shape.back() % 2 == 0) {
        kuafu::train::PiecePlace block = run;
        block.cuts = {{static_cast<int64_t>(run.shape.size()) - 1, 1, 2, 1}};
        saved.read_piece(name, block, whole.numel() / 2);
      }
    }
  });
  return 0;
}

// Strategies applied by module, to any model (torchtitan's per-module apply_ac / fully_shard is the
// example): a model names the submodules it calls as blocks and calls each through its BlockSites;
// from outside, a strategy wraps the blocks it chooses by path or name pattern (activation
// checkpointing) or acts through the block hooks on all of them (Gemini, ZeRO-3-style offload). A block
// takes and returns whatever tensors it needs (hooks::Tensors) and captures its other arguments. The
// model file names no strategy, only this interface.
//
//   struct UNetImpl : torch::nn::Module, hooks::SiteModel {
//     UNetImpl() { ...; sites_ = hooks::BlockSites(*this, {"conv_in", "down.0", "down.1", "mid", ...}); }
//     Tensor forward(x, t, context) {
//       auto out = sites_.call(*down[0], {x, temb, context}, [&](const hooks::Tensors& in) { ... });
//     }
//   };
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/hooks/block_hooks.h"

namespace kuafu::hooks {

// One part of the model as strategies name it: a name stable across steps (e.g. "transformer.h.3") and
// the paths, relative to the model, of the modules it computes with (e.g. "transformer.wte").
struct ModelPart {
  std::string name;
  std::vector<std::string> modules;
};

// What a strategy does around a block's call: runs `next` (the block, or the strategies inside this
// one) on `inputs` and returns its outputs.
using BlockWrapper = std::function<Tensors(const BlockCall& call, const Tensors& inputs, const BlockBody& next)>;

class BlockSites {
 public:
  BlockSites() = default;
  // Each of `paths` (relative to `root`) names a submodule the model calls as one block.
  BlockSites(torch::nn::Module& root, const std::vector<std::string>& paths);
  // Each of `parts` (module paths relative to `root`) as one block, in order; a part of one module is
  // also found by it (a model calling its blocks by module).
  static BlockSites of_parts(torch::nn::Module& root, const std::vector<ModelPart>& parts);

  // Adds a block that computes with several modules (a head reading two embeddings), named `call.name`;
  // `key` (may be null) is the module the model passes to call() for it.
  void add(BlockCall call, const torch::nn::Module* key = nullptr);

  // The model's side: runs `body` as the block `block` (or `name`) through the hooks and the wrappers
  // strategies put on it; a module that is no site runs `body` as it is.
  Tensors call(const torch::nn::Module& block, const Tensors& inputs, const BlockBody& body) const;
  torch::Tensor call(const torch::nn::Module& block, const torch::Tensor& input, const TensorBody& body) const;
  Tensors call(const std::string& name, const Tensors& inputs, const BlockBody& body) const;
  torch::Tensor call(const std::string& name, const torch::Tensor& input, const TensorBody& body) const;

  // The strategies' side. Block names in the order they were added.
  std::vector<std::string> names() const;
  // The names matching `pattern` (a glob: "down_blocks.*", "*"); kuafu::Error when none does.
  std::vector<std::string> matching(const std::string& pattern) const;
  // Puts `wrapper` around the calls of block `name`, inside the wrappers already there and inside the
  // hooks (so a strategy acting through the hooks sees the wrapped call as the block: Gemini gathers
  // before a checkpointed block recomputes).
  void wrap(const std::string& name, BlockWrapper wrapper);
  // Installs the hooks around every block (null removes them). Installing checks that the blocks hold
  // every parameter of `root` (a parameter outside every block would be read while its strategy has
  // it elsewhere): kuafu::Error naming the first that is not.
  void set_hooks(BlockHooks* hooks, const torch::nn::Module& root);
  bool has_hooks() const { return hooks_ != nullptr; }
  // Tells the hooks (if any) that one of several backward passes of a step has ended (BlockHooks).
  void end_backward_pass() const {
    if (hooks_) hooks_->end_backward_pass();
  }

 private:
  struct Site {
    BlockCall call;
    std::vector<BlockWrapper> wrappers;  // outermost first
  };
  Tensors run(const Site& site, const Tensors& inputs, const BlockBody& body) const;

  std::map<std::string, Site> sites_;
  std::vector<std::string> order_;
  std::map<const torch::nn::Module*, std::string> name_of_;
  BlockHooks* hooks_ = nullptr;
};

// A model whose strategies apply by module: its root module and the sites of its blocks.
class SiteModel {
 public:
  virtual ~SiteModel() = default;
  virtual torch::nn::Module& module() = 0;
  virtual BlockSites& block_sites() = 0;
  // Installs (null: removes) hooks around every block: BlockSites::set_hooks over this model.
  void set_block_hooks(BlockHooks* hooks) { block_sites().set_hooks(hooks, module()); }
};

}  // namespace kuafu::hooks

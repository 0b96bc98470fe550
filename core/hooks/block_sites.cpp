#include "core/hooks/block_sites.h"

#include <fnmatch.h>

#include <set>

#include "core/util/error.h"

namespace kuafu::hooks {

namespace {

std::map<std::string, const torch::nn::Module*> submodules_by_path(torch::nn::Module& root) {
  std::map<std::string, const torch::nn::Module*> modules;
  // Not the root itself: a model names its blocks in its constructor, before a holder owns it.
  for (const auto& item : root.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    modules[item.key()] = item.value().get();
  }
  return modules;
}

}  // namespace

BlockSites::BlockSites(torch::nn::Module& root, const std::vector<std::string>& paths) {
  std::vector<ModelPart> parts;
  for (const auto& path : paths) parts.push_back({path, {path}});
  *this = of_parts(root, parts);
}

BlockSites BlockSites::of_parts(torch::nn::Module& root, const std::vector<ModelPart>& parts) {
  BlockSites sites;
  const auto modules = submodules_by_path(root);
  for (const auto& part : parts) {
    BlockCall call{part.name, {}};
    for (const auto& path : part.modules) {
      const auto found = modules.find(path);
      KUAFU_CHECK(found != modules.end(), "the model names block ", part.name,
                  path == part.name ? std::string() : " with " + path, ", which is no submodule of it");
      call.modules.push_back(found->second);
    }
    const torch::nn::Module* key = call.modules.size() == 1 ? call.modules.front() : nullptr;
    sites.add(std::move(call), key);
  }
  return sites;
}

void BlockSites::add(BlockCall call, const torch::nn::Module* key) {
  KUAFU_CHECK(!sites_.count(call.name), "block ", call.name, " is named twice");
  if (key) name_of_[key] = call.name;
  order_.push_back(call.name);
  const std::string name = call.name;
  sites_[name] = Site{std::move(call), {}};
}

Tensors BlockSites::run(const Site& site, const Tensors& inputs, const BlockBody& body) const {
  // The wrappers from the innermost out, each calling the one inside it; the hooks around them all.
  BlockBody next = body;
  for (auto it = site.wrappers.rbegin(); it != site.wrappers.rend(); ++it) {
    next = [wrapper = *it, inner = std::move(next), &call = site.call](const Tensors& in) {
      return wrapper(call, in, inner);
    };
  }
  return run_block(hooks_, site.call, inputs, next);
}

Tensors BlockSites::call(const torch::nn::Module& block, const Tensors& inputs, const BlockBody& body) const {
  const auto found = name_of_.find(&block);
  if (found == name_of_.end()) return body(inputs);
  return run(sites_.at(found->second), inputs, body);
}

torch::Tensor BlockSites::call(const torch::nn::Module& block, const torch::Tensor& input, const TensorBody& body) const {
  if (!name_of_.count(&block)) return body(input);
  return call(block, Tensors{input}, as_block_body(body)).front();
}

Tensors BlockSites::call(const std::string& name, const Tensors& inputs, const BlockBody& body) const {
  const auto found = sites_.find(name);
  if (found == sites_.end()) return body(inputs);
  return run(found->second, inputs, body);
}

torch::Tensor BlockSites::call(const std::string& name, const torch::Tensor& input, const TensorBody& body) const {
  if (!sites_.count(name)) return body(input);
  return call(name, Tensors{input}, as_block_body(body)).front();
}

std::vector<std::string> BlockSites::names() const { return order_; }

std::vector<std::string> BlockSites::matching(const std::string& pattern) const {
  std::vector<std::string> found;
  for (const auto& name : order_) {
    if (fnmatch(pattern.c_str(), name.c_str(), 0) == 0) found.push_back(name);
  }
  if (found.empty()) {
    std::string known;
    for (const auto& name : order_) known += (known.empty() ? "" : ", ") + name;
    throw Error("no block of the model matches \"" + pattern + "\" (its blocks: " + known + ")");
  }
  return found;
}

void BlockSites::wrap(const std::string& name, BlockWrapper wrapper) {
  const auto found = sites_.find(name);
  KUAFU_CHECK(found != sites_.end(), "no block named ", name, " to wrap");
  found->second.wrappers.push_back(std::move(wrapper));
}

void BlockSites::set_hooks(BlockHooks* hooks, const torch::nn::Module& root) {
  if (hooks) {
    std::set<const void*> covered;
    for (const auto& [name, site] : sites_) {
      for (const auto* module : site.call.modules) {
        for (const auto& p : module->parameters()) covered.insert(p.unsafeGetTensorImpl());
      }
    }
    for (const auto& item : root.named_parameters()) {
      KUAFU_CHECK(covered.count(item.value().unsafeGetTensorImpl()), "parameter ", item.key(),
                  " lies in none of the model's blocks, so a strategy acting on blocks (memory.strategy, "
                  "memory.offload_frozen) cannot manage it; name its module among the blocks");
    }
  }
  hooks_ = hooks;
}

}  // namespace kuafu::hooks

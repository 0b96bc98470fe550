#include "core/nn/torch_init.h"

#include <c10/util/accumulate.h>

#include <cmath>
#include <map>

#include "core/parallel/tensor/factory.h"
#include "core/util/text.h"

namespace kuafu::nn {

void initialize_like_torch(torch::nn::Module& model) {
  std::map<std::string, std::vector<int64_t>> shapes;  // every parameter's shape, meta ones included
  for (const auto& item : model.named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  auto weight_beside = [&](const std::string& bias) -> const std::vector<int64_t>* {
    const auto found = shapes.find(bias.substr(0, bias.size() - 4) + "weight");
    return found == shapes.end() ? nullptr : &found->second;
  };
  parallel::initialize_like_serial(model, parallel::TensorParallel{}, [&](const std::string& name, torch::Tensor& full) {
    if (text::ends_with(name, "bias")) {
      const std::vector<int64_t>* weight = weight_beside(name);
      if (weight && weight->size() >= 2) {
        // fan_in: input channels times the kernel's elements, as torch.nn.init computes it.
        const int64_t fan_in = c10::multiply_integers(weight->begin() + 1, weight->end());
        const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
        full.uniform_(-bound, bound);
      } else {
        full.zero_();  // a norm's
      }
    } else if (full.dim() >= 2) {
      torch::nn::init::kaiming_uniform_(full, std::sqrt(5.0));
    } else {
      full.fill_(1.0);  // a norm's weight
    }
    return true;
  });
}

void initialize_by_module(torch::nn::Module& model, const ModuleValueRule& rule) {
  std::map<std::string, std::pair<const torch::nn::Module*, std::string>> owners;  // full name -> (owner, own name)
  for (const auto& item : model.named_modules()) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& own : item.value()->named_parameters(/*recurse=*/false))
      owners[prefix + own.key()] = {item.value().get(), own.key()};
  }
  parallel::initialize_like_serial(model, parallel::TensorParallel{}, [&](const std::string& name, torch::Tensor& full) {
    const auto& [owner, own_name] = owners.at(name);
    torch::Tensor value = full.device().is_cpu() ? full : torch::empty(full.sizes(), torch::kFloat32);
    if (!rule(*owner, own_name, value)) return false;
    if (!value.is_same(full)) full.copy_(value);
    return true;
  });
}

void initialize_like_transformers(torch::nn::Module& model, const parallel::TensorParallel& tp,
                                  const std::function<bool(const std::string& name)>& is_norm_weight,
                                  const std::function<double(const std::string& name)>& std_of) {
  parallel::initialize_like_serial(model, tp, [&](const std::string& name, torch::Tensor& full) {
    if (is_norm_weight(name)) {
      full.fill_(1.0);
    } else if (text::ends_with(name, ".bias")) {
      full.zero_();
    } else {
      full.normal_(0.0, std_of(name));
    }
    return true;
  });
}

}  // namespace kuafu::nn

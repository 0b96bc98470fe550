#include "apps/fastfold/alphafold_model.h"

#include <map>

#include <torch/torch.h>

#include "apps/fastfold/structure_labels.h"
#include "core/util/error.h"
#include "core/util/weight_sink.h"

namespace kuafu::fold {

EvoformerSizes AlphaFoldSizes::evoformer() const {
  return {msa_channels, pair_channels, msa_heads, pair_heads, outer_channels, triangle_channels, 4, false};
}

EvoformerSizes AlphaFoldSizes::extra_msa() const {
  return {extra_msa_channels, pair_channels, msa_heads, pair_heads, outer_channels, triangle_channels, 4, true};
}

AlphaFoldFeatures AlphaFoldFeatures::to(const torch::TensorOptions& options) const {
  AlphaFoldFeatures f = *this;
  for (torch::Tensor* t : {&f.aatype, &f.residue_index, &f.extra_msa}) *t = t->to(options.device());
  for (torch::Tensor* t : {&f.seq_mask, &f.target_feat, &f.msa_feat, &f.msa_mask, &f.extra_has_deletion, &f.extra_deletion_value,
                           &f.extra_msa_mask})
    *t = t->to(options.device(), options.dtype());
  return f;
}

Recycled Recycled::zeros(int64_t residues, const AlphaFoldSizes& sizes, const torch::TensorOptions& options) {
  return {torch::zeros({residues, sizes.msa_channels}, options), torch::zeros({residues, residues, sizes.pair_channels}, options),
          torch::zeros({residues, kAtom37, 3}, options)};
}

Recycled AlphaFoldOutputs::recycled() const {
  return {msa.select(0, 0).detach(), pair.detach(), atom37.detach()};
}

AlphaFoldOutputs AlphaFoldOutputs::first_residues(int64_t residues) const {
  if (atom37.size(0) == residues) return *this;
  const auto first = [residues](const torch::Tensor& t, int64_t dim) { return t.narrow(dim, 0, residues); };
  AlphaFoldOutputs out = *this;
  out.msa = first(msa, 1);
  out.pair = first(first(pair, 0), 1);
  out.single = first(single, 0);
  out.atom37 = first(atom37, 0);
  out.distogram_logits = first(first(distogram_logits, 0), 1);
  out.masked_msa_logits = first(masked_msa_logits, 1);
  out.plddt_logits = first(plddt_logits, 0);
  StructureOutputs& s = out.structure;
  s.single = first(s.single, 0);
  for (torch::Tensor* t : {&s.quaternions, &s.translations, &s.unnormalized_angles, &s.angles, &s.frames.rotation,
                           &s.frames.translation, &s.atom14})
    *t = first(*t, 1);
  return out;
}

EmbeddingsAndEvoformerImpl::EmbeddingsAndEvoformerImpl(const AlphaFoldSizes& s, const torch::Device& device) {
  input_embedder = register_module("input_embedder", InputEmbedder(s.msa_channels, s.pair_channels, s.max_relative, device));
  recycling_embedder = register_module(
      "recycling_embedder", RecyclingEmbedder(s.msa_channels, s.pair_channels, s.recycle_bins, s.recycle_min, s.recycle_max, device));
  extra_msa_activations = register_module("extra_msa_activations", AfLinear(kExtraMsaFeatures, s.extra_msa_channels, device));
  for (int64_t b = 0; b < s.extra_msa_blocks; ++b) extra_msa_stack->push_back(EvoformerBlock(s.extra_msa(), device));
  for (int64_t b = 0; b < s.evoformer_blocks; ++b) evoformer_iteration->push_back(EvoformerBlock(s.evoformer(), device));
  register_module("extra_msa_stack", extra_msa_stack);
  register_module("evoformer_iteration", evoformer_iteration);
  single_activations = register_module("single_activations", AfLinear(s.msa_channels, s.single_channels, device));
}

AlphaFoldImpl::AlphaFoldImpl(const AlphaFoldSizes& s, const parallel::ModelOptions& options)
    : sizes(s), layout(options.dap) {
  const torch::Device& device = options.device;
  sizes.structure.single_channels = s.single_channels;
  sizes.structure.ipa.pair_channels = s.pair_channels;
  evoformer = register_module("evoformer", EmbeddingsAndEvoformer(sizes, device));
  structure_module = register_module("structure_module", StructureModule(sizes.structure, device));
  distogram_head = register_module("distogram_head", DistogramHead(s.pair_channels, s.distogram_bins, device));
  masked_msa_head = register_module("masked_msa_head", MaskedMsaHead(s.msa_channels, s.msa_classes, device));
  predicted_lddt_head =
      register_module("predicted_lddt_head", PlddtHead(sizes.structure.ipa.single_channels, s.plddt_channels, s.plddt_bins, device));
  std::vector<hooks::ModelPart> parts = {
      {"embed", {"evoformer.input_embedder", "evoformer.recycling_embedder", "evoformer.extra_msa_activations"}}};
  for (int64_t b = 0; b < s.extra_msa_blocks; ++b)
    parts.push_back({"extra_msa_stack." + std::to_string(b), {"evoformer.extra_msa_stack." + std::to_string(b)}});
  for (int64_t b = 0; b < s.evoformer_blocks; ++b)
    parts.push_back({"evoformer." + std::to_string(b), {"evoformer.evoformer_iteration." + std::to_string(b)}});
  parts.push_back({"structure", {"evoformer.single_activations", "structure_module"}});
  parts.push_back({"heads", {"distogram_head", "masked_msa_head", "predicted_lddt_head"}});
  sites = hooks::BlockSites::of_parts(*this, parts);
}

AlphaFoldOutputs AlphaFoldImpl::iteration(const AlphaFoldFeatures& f, Recycled previous, const ResidueGeometry& geometry) {
  using hooks::Tensors;
  EmbeddingsAndEvoformerImpl& trunk = *evoformer;
  // Every site's body holds copies of what it reads besides its inputs: a checkpointed block runs again in
  // backward, after the caller's features and geometry are gone.
  // Embedding: the MSA stream m [S, R, c_m], the pair z [R, R, c_z], the extra MSA e [E, R, c_e].
  Tensors streams = sites.call("embed", {previous.msa_first_row, previous.pair, previous.positions}, [f, &trunk](const Tensors& in) {
    auto [m, z] = trunk.input_embedder(f.target_feat, f.msa_feat, f.residue_index);
    const torch::Tensor previous_beta = pseudo_beta(f.aatype, in[2], torch::ones_like(in[2].select(-1, 0))).first;
    const auto [first_row, pair_update] = trunk.recycling_embedder(in[0], in[1], previous_beta);
    m = torch::cat({m.narrow(0, 0, 1) + first_row.unsqueeze(0), m.narrow(0, 1, m.size(0) - 1)});
    const torch::Tensor e =
        trunk.extra_msa_activations(extra_msa_features(f.extra_msa, f.extra_has_deletion, f.extra_deletion_value));
    return Tensors{m, z + pair_update, e};
  });
  // Under DAP each rank runs the stacks on its rows of the three streams: m [S', R, c_m], z [R', R, c_z],
  // e [E', R, c_e] (every rank embedded them whole).
  torch::Tensor m = layout.mine(streams[0], 0), z = layout.mine(streams[1], 0), e = layout.mine(streams[2], 0);
  // Neither the embedded streams nor the recycled ones are read again: the stacks' first updates free them.
  streams.clear();
  previous = {};
  const torch::Tensor pair_mask = f.seq_mask.unsqueeze(1) * f.seq_mask.unsqueeze(0);  // [R, R]
  for (size_t b = 0; b < trunk.extra_msa_stack->size(); ++b) {
    EvoformerBlockImpl& block = *trunk.extra_msa_stack[b]->as<EvoformerBlock>();
    const Tensors out = sites.call("extra_msa_stack." + std::to_string(b), {e, z},
                                   [&block, extra_mask = f.extra_msa_mask, pair_mask, this](const Tensors& in) {
      const auto [e2, z2] = block.forward(in[0], in[1], extra_mask, pair_mask, chunk_size, layout);
      return Tensors{e2, z2};
    });
    e = out[0];
    z = out[1];
  }
  for (size_t b = 0; b < trunk.evoformer_iteration->size(); ++b) {
    EvoformerBlockImpl& block = *trunk.evoformer_iteration[b]->as<EvoformerBlock>();
    const Tensors out = sites.call("evoformer." + std::to_string(b), {m, z},
                                   [&block, msa_mask = f.msa_mask, pair_mask, this](const Tensors& in) {
      const auto [m2, z2] = block.forward(in[0], in[1], msa_mask, pair_mask, chunk_size, layout);
      return Tensors{m2, z2};
    });
    m = out[0];
    z = out[1];
  }
  // Whole again: every rank runs the structure module and the heads on the same tensors.
  m = layout.whole(m, 0);
  z = layout.whole(z, 0);
  AlphaFoldOutputs out;
  out.msa = m;
  out.pair = z;
  // The structure module's outputs travel as tensors through its site, then back into StructureOutputs.
  const Tensors structure = sites.call("structure", {m.select(0, 0), z},
                                       [aatype = f.aatype, mask = f.seq_mask, geometry, &trunk, this](const Tensors& in) {
    const torch::Tensor single = trunk.single_activations(in[0]);
    const StructureOutputs s = structure_module->forward(single, in[1], aatype, mask, geometry);
    return Tensors{single, s.single, s.quaternions, s.translations, s.unnormalized_angles, s.angles,
                   s.frames.rotation, s.frames.translation, s.atom14};
  });
  out.single = structure[0];
  out.structure = {structure[1], structure[2], structure[3], structure[4], structure[5], {structure[6], structure[7]}, structure[8]};
  out.atom37 = atom14_to_atom37(geometry, f.aatype, out.structure.atom14.select(0, -1));
  const Tensors heads = sites.call("heads", {z, m, out.structure.single}, [this](const Tensors& in) {
    return Tensors{distogram_head(in[0]), masked_msa_head(in[1]), predicted_lddt_head(in[2])};
  });
  out.distogram_logits = heads[0];
  out.masked_msa_logits = heads[1];
  out.plddt_logits = heads[2];
  return out;
}

AlphaFoldOutputs AlphaFoldImpl::forward(const std::vector<AlphaFoldFeatures>& iterations, const ResidueGeometry& geometry) {
  KUAFU_CHECK(!iterations.empty(), "AlphaFold: no iteration's features");
  Recycled previous = Recycled::zeros(iterations.front().aatype.size(0), sizes, iterations.front().target_feat.options());
  for (size_t i = 0; i + 1 < iterations.size(); ++i) {
    torch::NoGradGuard no_grad;
    previous = iteration(iterations[i], std::move(previous), geometry).recycled();
  }
  return iteration(iterations.back(), std::move(previous), geometry);
}

std::vector<AlphaFoldParameter> alphafold_parameters(AlphaFoldImpl& model) {
  std::vector<AlphaFoldParameter> out;
  for (const auto& item : model.named_parameters()) {
    // "evoformer.evoformer_iteration.3.msa_transition.transition1.weights" -> scope
    // "evoformer/evoformer_iteration/msa_transition", name "transition1.weights", block 3; the embedders'
    // own scopes do not exist in AlphaFold's layout.
    std::vector<std::string> parts;
    for (size_t start = 0, dot; start <= item.key().size(); start = dot + 1) {
      dot = item.key().find('.', start);
      if (dot == std::string::npos) dot = item.key().size();
      parts.push_back(item.key().substr(start, dot - start));
    }
    AlphaFoldParameter parameter{item.key(), item.value(), "", -1};
    std::string path;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i] == "input_embedder" || parts[i] == "recycling_embedder") continue;
      if (i > 0 && (parts[i - 1] == "evoformer_iteration" || parts[i - 1] == "extra_msa_stack")) {
        parameter.block = std::stoll(parts[i]);
        continue;
      }
      path += "/" + parts[i];
    }
    // The last module scope before the name: what alphafold_key puts before "//".
    parameter.key = "alphafold/alphafold_iteration" + path + "//" + parts.back();
    out.push_back(parameter);
  }
  return out;
}

void load_alphafold(AlphaFoldImpl& model, const io::NpzArrays& params) {
  torch::NoGradGuard no_grad;
  for (AlphaFoldParameter& p : alphafold_parameters(model)) {
    const auto found = params.find(p.key);
    KUAFU_CHECK(found != params.end(), "AlphaFold parameters: no array '", p.key, "'");
    const torch::Tensor value = p.block >= 0 ? found->second[p.block] : found->second;
    KUAFU_CHECK(value.sizes() == p.tensor.sizes(), "AlphaFold parameters: '", p.key, p.block >= 0 ? " (block " + std::to_string(p.block) + ")" : "",
                "' is ", value.sizes(), ", the model's is ", p.tensor.sizes());
    put_weight(p.name, p.tensor, value);
  }
}

io::NpzArrays alphafold_arrays(AlphaFoldImpl& model) {
  std::map<std::string, std::vector<torch::Tensor>> blocks;
  io::NpzArrays out;
  for (const AlphaFoldParameter& p : alphafold_parameters(model)) {
    const torch::Tensor value = p.tensor.detach().to(torch::kCPU, torch::kFloat32);
    if (p.block < 0) {
      out[p.key] = value.clone();
    } else {
      auto& list = blocks[p.key];
      if (static_cast<int64_t>(list.size()) <= p.block) list.resize(p.block + 1);
      list[p.block] = value;
    }
  }
  for (auto& [key, list] : blocks) out[key] = torch::stack(list);
  return out;
}

}  // namespace kuafu::fold

#include "apps/fastfold/alphafold_model.h"

#include <algorithm>
#include <map>
#include <set>

#include <torch/torch.h>

#include "apps/fastfold/alphafold_batch.h"
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

Recycled Recycled::zeros(int64_t residues, const AlphaFoldSizes& sizes, const torch::TensorOptions& options,
                         std::optional<torch::ScalarType> pair_dtype) {
  return {torch::zeros({residues, sizes.msa_channels}, options),
          torch::zeros({residues, residues, sizes.pair_channels}, options.dtype(pair_dtype.value_or(options.dtype().toScalarType()))),
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
  if (experimentally_resolved_logits.defined()) out.experimentally_resolved_logits = first(experimentally_resolved_logits, 0);
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
  if (s.experimentally_resolved_head) {
    experimentally_resolved_head =
        register_module("experimentally_resolved_head", ExperimentallyResolvedHead(s.single_channels, device));
  }
}

hooks::ModelPart AlphaFoldImpl::head_part() const {
  return {"embed", {"evoformer.input_embedder", "evoformer.recycling_embedder", "evoformer.extra_msa_activations"}};
}

hooks::ModelPart AlphaFoldImpl::block_part(int64_t i) const {
  if (i < sizes.extra_msa_blocks) return {"extra_msa_stack." + std::to_string(i), {"evoformer.extra_msa_stack." + std::to_string(i)}};
  const std::string b = std::to_string(i - sizes.extra_msa_blocks);
  return {"evoformer." + b, {"evoformer.evoformer_iteration." + b}};
}

hooks::ModelPart AlphaFoldImpl::tail_part() const {
  hooks::ModelPart tail{"structure", {"evoformer.single_activations", "structure_module", "distogram_head", "masked_msa_head",
                                      "predicted_lddt_head"}};
  if (sizes.experimentally_resolved_head) tail.modules.push_back("experimentally_resolved_head");
  return tail;
}

int64_t AlphaFoldImpl::iterations(const hooks::Batch& batch) const { return batch_iterations(batch); }

hooks::Batch AlphaFoldImpl::iteration_batch(const hooks::Batch& batch, int64_t i) const { return iteration_features(batch, i); }

torch::ScalarType AlphaFoldImpl::trunk_dtype() const { return evoformer->single_activations->weights.scalar_type(); }

torch::ScalarType AlphaFoldImpl::output_dtype() const { return structure_module->single_layer_norm->scale.scalar_type(); }

hooks::Tensors AlphaFoldImpl::head_streams(const hooks::Batch& batch, const hooks::Tensors& recycled) {
  EmbeddingsAndEvoformerImpl& trunk = *evoformer;
  const AlphaFoldFeatures f = features_of(batch);
  // The features come in the outputs' dtype, the recycled pair in the trunk's; the trunk may run in another
  // dtype than the outputs (bf16 inference).
  const torch::ScalarType dtype = trunk_dtype();
  const Recycled previous = recycled.empty() ? Recycled::zeros(f.aatype.size(0), sizes, f.target_feat.options(), dtype)
                                             : Recycled{recycled.at(0), recycled.at(1), recycled.at(2)};
  const auto in_trunk = [dtype](const torch::Tensor& t) { return t.to(dtype); };
  // The MSA stream m [S, R, c_m], the pair z [R, R, c_z], the extra MSA e [E, R, c_e].
  auto [m, z] = trunk.input_embedder(in_trunk(f.target_feat), in_trunk(f.msa_feat), f.residue_index);
  const torch::Tensor previous_beta =
      pseudo_beta(f.aatype, previous.positions, torch::ones_like(previous.positions.select(-1, 0))).first;
  const auto [first_row, pair_update] =
      trunk.recycling_embedder(in_trunk(previous.msa_first_row), in_trunk(previous.pair), previous_beta);
  m = torch::cat({m.narrow(0, 0, 1) + first_row.unsqueeze(0), m.narrow(0, 1, m.size(0) - 1)});
  z = z + pair_update;
  // Under DAP each rank runs the stacks on its rows of the streams (every rank embedded them whole).
  if (sizes.extra_msa_blocks == 0) return {layout.mine(m, 0), layout.mine(z, 0)};
  const torch::Tensor e =
      trunk.extra_msa_activations(extra_msa_features(f.extra_msa, in_trunk(f.extra_has_deletion), in_trunk(f.extra_deletion_value)));
  return {layout.mine(m, 0), layout.mine(z, 0), layout.mine(e, 0)};
}

hooks::Tensors AlphaFoldImpl::block_streams(int64_t i, const hooks::Tensors& streams, const hooks::Batch& batch) {
  EmbeddingsAndEvoformerImpl& trunk = *evoformer;
  // The masks in the streams' dtype (a float32 mask would lift a bf16 trunk's logits to float32).
  const torch::ScalarType dtype = streams.at(1).scalar_type();
  const torch::Tensor seq_mask = batch["seq_mask"].to(dtype);
  const torch::Tensor pair_mask = seq_mask.unsqueeze(1) * seq_mask.unsqueeze(0);  // [R, R]
  if (i < sizes.extra_msa_blocks) {
    EvoformerBlockImpl& block = *trunk.extra_msa_stack[static_cast<size_t>(i)]->as<EvoformerBlock>();
    const auto [e, z] = block.forward(streams.at(2), streams.at(1), batch["extra_msa_mask"].to(dtype), pair_mask, chunk_size, layout);
    // The MSA stream passes by; the extra MSA ends with its stack.
    if (i + 1 == sizes.extra_msa_blocks) return {streams.at(0), z};
    return {streams.at(0), z, e};
  }
  EvoformerBlockImpl& block = *trunk.evoformer_iteration[static_cast<size_t>(i - sizes.extra_msa_blocks)]->as<EvoformerBlock>();
  const auto [m, z] = block.forward(streams.at(0), streams.at(1), batch["msa_mask"].to(dtype), pair_mask, chunk_size, layout);
  return {m, z};
}

AlphaFoldOutputs AlphaFoldImpl::outputs(const hooks::Tensors& streams, const hooks::Batch& batch, const ResidueGeometry& geometry) {
  // Whole again: every rank runs the structure module and the heads on the same tensors.
  const torch::Tensor aatype = batch["aatype"];
  AlphaFoldOutputs out;
  out.msa = layout.whole(streams.at(0), 0);
  out.pair = layout.whole(streams.at(1), 0);
  // The single projection in the trunk's dtype, then everything in the outputs' (the same but for bf16
  // inference, where the structure module and the heads run in float32). The pair stays in the trunk's
  // dtype (it is recycled into the trunk): the structure module and the distogram read it a chunk of rows at
  // a time in theirs, so no whole float32 copy of it is made.
  const torch::ScalarType dtype = output_dtype();
  out.single = evoformer->single_activations(out.msa.select(0, 0)).to(dtype);
  out.msa = out.msa.to(dtype);
  out.structure = structure_module->forward(out.single, out.pair, aatype, batch["seq_mask"], geometry, chunk_size);
  out.atom37 = atom14_to_atom37(geometry, aatype, out.structure.atom14.select(0, -1));
  out.distogram_logits = distogram_head->forward(out.pair, chunk_size);
  out.masked_msa_logits = masked_msa_head(out.msa);
  out.plddt_logits = predicted_lddt_head(out.structure.single);
  if (experimentally_resolved_head) out.experimentally_resolved_logits = experimentally_resolved_head(out.single);
  return out;
}

AlphaFoldLoss AlphaFoldImpl::training_loss(const AlphaFoldOutputs& out, const hooks::Batch& batch,
                                           const AlphaFoldLossSettings& settings) {
  return alphafold_loss(out, labels_of(batch), geometry_like(out.pair), sizes, settings);
}

torch::Tensor AlphaFoldImpl::tail_loss_streams(const hooks::Tensors& streams, const hooks::Batch& batch) {
  return training_loss(outputs(streams, batch, geometry_like(streams.at(1))), batch, loss_settings).total;
}

torch::Tensor AlphaFoldImpl::tail_sums_streams(const hooks::Tensors& streams, const hooks::Batch& batch) {
  const double loss = tail_loss_streams(streams, batch).item<double>();
  return torch::tensor({loss, 1.0, 0.0}, torch::TensorOptions(torch::kFloat64).device(streams.at(1).device()));
}

hooks::Tensors AlphaFoldImpl::recycled_streams(const hooks::Tensors& final_streams, const hooks::Batch& batch) {
  const Recycled r = outputs(final_streams, batch, geometry_like(final_streams.at(1))).recycled();
  return {r.msa_first_row, r.pair, r.positions};
}

const ResidueGeometry& AlphaFoldImpl::geometry_like(const torch::Tensor& like) {
  const torch::Tensor& kept = geometry_.atom14_positions;
  const torch::ScalarType dtype = output_dtype();
  if (!kept.defined() || kept.scalar_type() != dtype || kept.device() != like.device()) {
    geometry_ = ideal_residue_geometry().to(like.options().dtype(dtype));
  }
  return geometry_;
}

namespace {

// The outputs as the tensors a block site passes (the experimentally-resolved logits last, where the model has
// the head), and back.
hooks::Tensors output_tensors(const AlphaFoldOutputs& o) {
  const StructureOutputs& s = o.structure;
  hooks::Tensors t{o.msa, o.pair, o.single, o.atom37, o.distogram_logits, o.masked_msa_logits, o.plddt_logits, s.single, s.quaternions,
                   s.translations, s.unnormalized_angles, s.angles, s.frames.rotation, s.frames.translation, s.atom14};
  if (o.experimentally_resolved_logits.defined()) t.push_back(o.experimentally_resolved_logits);
  return t;
}

AlphaFoldOutputs outputs_of(const hooks::Tensors& t) {
  AlphaFoldOutputs o;
  o.msa = t[0];
  o.pair = t[1];
  o.single = t[2];
  o.atom37 = t[3];
  o.distogram_logits = t[4];
  o.masked_msa_logits = t[5];
  o.plddt_logits = t[6];
  o.structure = {t[7], t[8], t[9], t[10], t[11], {t[12], t[13]}, t[14]};
  if (t.size() > 15) o.experimentally_resolved_logits = t[15];
  return o;
}

}  // namespace

AlphaFoldOutputs AlphaFoldImpl::tail_outputs(const hooks::Tensors& streams, const hooks::Batch& batch,
                                             const ResidueGeometry& geometry) {
  // The body holds copies of what it reads besides its inputs: a checkpointed part runs again in backward.
  return outputs_of(block_sites().call(tail_part().name, streams, [this, batch, geometry](const hooks::Tensors& in) {
    return output_tensors(outputs(in, batch, geometry));
  }));
}

AlphaFoldOutputs AlphaFoldImpl::iteration(const AlphaFoldFeatures& f, Recycled previous, const ResidueGeometry& geometry) {
  const hooks::Batch batch = iteration_features(alphafold_batch({f}), 0);
  hooks::Tensors recycled{previous.msa_first_row, previous.pair, previous.positions};
  previous = {};
  return tail_outputs(call_head_and_blocks(batch, std::move(recycled)), batch, geometry);
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

AlphaFoldOutputs AlphaFoldImpl::forward(const hooks::Batch& batch) {
  const hooks::Batch last = iteration_batch(batch, iterations(batch) - 1);
  const hooks::Tensors streams = call_head_and_blocks(last, recycle(batch));
  return tail_outputs(streams, last, geometry_like(streams.at(1)));
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

std::vector<std::string> unused_alphafold_arrays(AlphaFoldImpl& model, const io::NpzArrays& params) {
  std::set<std::string> read;
  for (const AlphaFoldParameter& p : alphafold_parameters(model)) read.insert(p.key);
  std::vector<std::string> unused;
  for (const auto& item : params)
    if (!read.count(item.first)) unused.push_back(item.first);
  std::sort(unused.begin(), unused.end());
  return unused;
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

#include "apps/fastfold/fold_settings.h"

#include "core/train/benchmark.h"
#include "core/train/runtime.h"
#include "core/train/train_settings.h"
#include "core/train/trainer.h"

namespace kuafu::fold {

config::Schema fold_schema() {
  config::Schema s;
  train::add_runtime_schema(s);
  train::add_trainer_schema(s);
  train::add_benchmark_schema(s);
  // AlphaFold 2's sizes by default (supplement 1.11, Table 4's model): 93M parameters.
  s.add_int("model.msa_channels", 256, "c_m: the MSA stream's channels").min(1).max(1 << 14);
  s.add_int("model.pair_channels", 128, "c_z: the pair stream's channels").min(1).max(1 << 14);
  s.add_int("model.single_channels", 384, "c_s: the single representation's channels").min(1).max(1 << 14);
  s.add_int("model.extra_msa_channels", 64, "c_e: the extra MSA stack's channels").min(1).max(1 << 14);
  s.add_int("model.evoformer_blocks", 48, "Evoformer blocks").min(1).max(1000);
  s.add_int("model.extra_msa_blocks", 4, "extra MSA stack blocks").min(1).max(1000);
  s.add_int("model.msa_heads", 8, "heads of the MSA row and column attention").min(1).max(256);
  s.add_int("model.pair_heads", 4, "heads of the triangle attention").min(1).max(256);
  s.add_int("model.outer_channels", 32, "the outer product mean's channels").min(1).max(4096);
  s.add_int("model.triangle_channels", 128, "the triangle multiplication's channels").min(1).max(4096);
  s.add_int("model.structure_channels", 384, "the structure module's channels").min(1).max(1 << 14);
  s.add_int("model.structure_layers", 8, "structure module layers (shared weights)").min(1).max(100);
  s.add_int("model.ipa_heads", 12, "invariant point attention heads").min(1).max(256);
  s.add_int("model.ipa_scalar_channels", 16, "IPA scalar query/key and value channels per head").min(1).max(1024);
  s.add_int("model.ipa_query_points", 4, "IPA query/key points per head").min(1).max(256);
  s.add_int("model.ipa_value_points", 8, "IPA value points per head").min(1).max(256);
  s.add_int("model.angle_channels", 128, "the torsion-angle ResNet's channels").min(1).max(4096);
  s.add_int("model.plddt_channels", 128, "the pLDDT head's hidden channels").min(1).max(4096);
  s.add_bool("model.experimentally_resolved_head", false,
             "the experimentally-resolved head (AlphaFold's fine-tuning stage; DeepMind's parameter files carry it)");
  s.add_string("model.init_from", "", "a params_model_*.npz (DeepMind's layout, or kuafu-fold export's) to start from");

  s.add_string("data.dir", "data/fastfold", "the prepared folder (kuafu-fold prepare writes it)");
  s.add_string("data.structure_db", kDebianStructureDb, "ProMod3's structure database (Debian's promod3-data)");
  s.add_int("data.crop_size", 256, "residues of a training example (a contiguous window of its chain)").min(8).max(1 << 16);
  s.add_int("data.eval_crop_size", 384, "residues an evaluated chain keeps (its first ones)").min(8).max(1 << 16);
  s.add_int("data.max_recycles", 3, "recycling iterations beyond the first: training draws 0..max each step").min(0).max(64);
  s.add_int("data.eval_chains", 0, "validation chains evaluated (0: all)").min(0);
  s.add_int("data.max_msa_clusters", 128, "MSA rows the Evoformer sees (the query and sampled rows)").min(1).max(1 << 16);
  s.add_int("data.max_extra_msa", 1024, "extra MSA rows").min(0).max(1 << 20);
  s.add_int("data.profile_rows", 0, "alignment rows drawn from ProMod3's HHblits profile of the chain (its UniProt "
                                     "homologs' residue frequencies), added to its MSA in every example; 0: none").min(0).max(1 << 16);
  s.add_float("data.bert_fraction", 0.15, "MSA positions replaced for the masked-MSA loss").min(0).max(1);
  s.add_int("data.chunk_size", 0, "predict and eval: the Evoformer's attention, transitions and outer products, the "
                                  "structure module's attention and the distogram this many rows at a time (less "
                                  "memory at long lengths, the same result); 0: whole").min(0);
  s.add_float("loss.clamped_fape_fraction", 0.9, "weight of the clamped backbone FAPE (the rest unclamped)").min(0).max(1);
  s.add_float("loss.distogram", 0.3, "distogram loss weight").min(0);
  s.add_float("loss.masked_msa", 2.0, "masked MSA loss weight").min(0);
  s.add_float("loss.plddt", 0.01, "pLDDT loss weight").min(0);
  s.add_float("loss.violation", 0.0, "structural violation loss weight (AlphaFold's fine-tuning stage: 1)").min(0);
  s.add_float("loss.experimentally_resolved", 0.0,
              "experimentally-resolved loss weight (AlphaFold's fine-tuning stage: 0.01; needs model.experimentally_resolved_head)").min(0);
  s.add_float("loss.violation_tolerance", 12.0, "spreads of the PDB's distribution a bond or angle may deviate").min(0);
  s.add_float("loss.clash_overlap", 1.5, "Å two atoms' van der Waals radii may overlap before they clash").min(0);

  s.add_int("prepare.max_chains", 0, "chains drawn from the structure database (0: all 20,648 distinct sequences)").min(0);
  s.add_int("prepare.min_length", 40, "shortest chain").min(1);
  s.add_int("prepare.max_length", 1000, "longest chain").min(1);
  s.add_int("prepare.seed", 0, "chain draw and split").min(0);
  s.add_float("prepare.val_fraction", 0.1, "chains in the validation split (whole sequence-identity groups)").min(0).max(1);
  s.add_float("prepare.test_fraction", 0.1, "chains in the test split").min(0).max(1);
  s.add_bool("prepare.msas", true, "build an a3m MSA per chain with mmseqs2 (against the training chains)");
  s.add_int("prepare.threads", 0, "mmseqs threads (0: every core)").min(0);
  s.add_bool("prepare.overwrite", false, "replace an existing data.dir once the new one is complete");
  return s;
}

FoldSettings read_fold_settings(const config::Config& c) {
  FoldSettings s;
  AlphaFoldSizes& m = s.model;
  m.msa_channels = c.get_int("model.msa_channels");
  m.pair_channels = c.get_int("model.pair_channels");
  m.single_channels = c.get_int("model.single_channels");
  m.extra_msa_channels = c.get_int("model.extra_msa_channels");
  m.evoformer_blocks = c.get_int("model.evoformer_blocks");
  m.extra_msa_blocks = c.get_int("model.extra_msa_blocks");
  m.msa_heads = c.get_int("model.msa_heads");
  m.pair_heads = c.get_int("model.pair_heads");
  m.outer_channels = c.get_int("model.outer_channels");
  m.triangle_channels = c.get_int("model.triangle_channels");
  m.structure.layers = c.get_int("model.structure_layers");
  m.structure.angle_channels = c.get_int("model.angle_channels");
  const int64_t scalar = c.get_int("model.ipa_scalar_channels");
  m.structure.ipa = {c.get_int("model.structure_channels"), m.pair_channels, c.get_int("model.ipa_heads"), scalar, scalar,
                     c.get_int("model.ipa_query_points"), c.get_int("model.ipa_value_points")};
  m.plddt_channels = c.get_int("model.plddt_channels");
  m.experimentally_resolved_head = c.get_bool("model.experimentally_resolved_head");
  for (const auto& [key, channels, heads] : {std::tuple{"model.msa_heads", m.msa_channels, m.msa_heads},
                                             std::tuple{"model.msa_heads", m.extra_msa_channels, m.msa_heads},
                                             std::tuple{"model.pair_heads", m.pair_channels, m.pair_heads}}) {
    if (channels % heads != 0)
      c.fail_at(key, "(" + std::to_string(heads) + ") must divide the channels it splits (" + std::to_string(channels) + ")");
  }
  s.init_from = c.get_string("model.init_from");
  s.data_dir = c.get_string("data.dir");
  s.structure_db = c.get_string("data.structure_db");
  s.crop_size = c.get_int("data.crop_size");
  s.eval_crop_size = c.get_int("data.eval_crop_size");
  s.max_recycles = c.get_int("data.max_recycles");
  s.eval_chains = c.get_int("data.eval_chains");
  s.sampling.max_clusters = c.get_int("data.max_msa_clusters");
  s.sampling.max_extra = c.get_int("data.max_extra_msa");
  s.sampling.replace_fraction = c.get_float("data.bert_fraction");
  s.profile_rows = c.get_int("data.profile_rows");
  s.chunk_size = c.get_int("data.chunk_size");
  s.clamped_fape_fraction = c.get_float("loss.clamped_fape_fraction");
  s.loss.distogram_weight = c.get_float("loss.distogram");
  s.loss.masked_msa_weight = c.get_float("loss.masked_msa");
  s.loss.plddt_weight = c.get_float("loss.plddt");
  s.loss.violation_weight = c.get_float("loss.violation");
  s.loss.experimentally_resolved_weight = c.get_float("loss.experimentally_resolved");
  if (s.loss.experimentally_resolved_weight > 0 && !m.experimentally_resolved_head)
    c.fail_at("loss.experimentally_resolved", "weighs a head the model does not have: set model.experimentally_resolved_head = true");
  s.loss.violation.tolerance_factor = c.get_float("loss.violation_tolerance");
  s.loss.violation.clash_overlap = c.get_float("loss.clash_overlap");
  s.seed = train::read_train_settings(c).seed;
  return s;
}

DataRecipeOptions read_recipe_options(const config::Config& c) {
  DataRecipeOptions o;
  o.structure_db = c.get_string("data.structure_db");
  o.out_dir = c.get_string("data.dir");
  o.overwrite = c.get_bool("prepare.overwrite");
  o.threads = static_cast<int>(c.get_int("prepare.threads"));
  o.selection.min_length = static_cast<size_t>(c.get_int("prepare.min_length"));
  o.selection.max_length = static_cast<size_t>(c.get_int("prepare.max_length"));
  o.selection.max_chains = static_cast<size_t>(c.get_int("prepare.max_chains"));
  o.selection.seed = static_cast<uint64_t>(c.get_int("prepare.seed"));
  o.split.val = c.get_float("prepare.val_fraction");
  o.split.test = c.get_float("prepare.test_fraction");
  o.split.train = 1.0 - o.split.val - o.split.test;
  if (o.split.train <= 0) c.fail_at("prepare.val_fraction", "and prepare.test_fraction leave no training chains");
  o.split.seed = o.selection.seed;
  o.msa.build = c.get_bool("prepare.msas");
  return o;
}

}  // namespace kuafu::fold

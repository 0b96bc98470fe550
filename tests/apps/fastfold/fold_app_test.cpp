// kuafu-fold's data and commands: a step's rows the same however they are split among micro-batches and
// ranks, a predicted structure written as a PDB file and read back, and bad inputs named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <tuple>

#include <torch/torch.h>

#include "apps/fastfold/alphafold_batch.h"
#include "apps/fastfold/commands.h"
#include "apps/fastfold/feature_cache.h"
#include "apps/fastfold/fold_settings.h"
#include "apps/fastfold/fold_task.h"
#include "apps/fastfold/pdb_file.h"
#include "core/parallel/tensor/factory.h"
#include "core/util/error.h"
#include "tests/apps/fastfold/alphafold_golden.h"

namespace kuafu::fold {
namespace {
namespace fs = std::filesystem;

using testing::database_chains;

// The golden tiny model's sizes on crops of `crop` residues (8 MSA clusters, 8 extra rows) recycling up to
// `max_recycles` times, and that model at AlphaFold's initial values from seed 0.
FoldSettings tiny_task_settings(int64_t crop, int64_t max_recycles) {
  FoldSettings settings;
  settings.model = testing::golden_tiny_sizes();
  settings.crop_size = crop;
  settings.max_recycles = max_recycles;
  settings.sampling = {8, 8};
  return settings;
}

AlphaFold initialized_model(const FoldSettings& settings) {
  torch::manual_seed(0);
  AlphaFold model(settings.model);
  initialize_alphafold_weights(*model);
  return model;
}

// Each row's loss depends on (seed, step, row) alone: a step's two rows in one call are the mean of the two
// computed one at a time (float32, the same operations: 1e-6 relative).
TEST(FoldTaskTest, AStepsRowsDoNotDependOnHowTheyAreSplit) {
  const FoldSettings settings = tiny_task_settings(24, 1);
  FoldTask task(initialized_model(settings), settings, database_chains(4), {}, 2, torch::kCPU);
  for (int64_t step : {0, 3}) {
    const double both = task.loss(step, 0, 2).item<double>();
    const double first = task.loss(step, 0, 1).item<double>(), second = task.loss(step, 1, 1).item<double>();
    EXPECT_NEAR(both, (first + second) / 2, 1e-6 * std::abs(both)) << "step " << step;
    EXPECT_EQ(task.iterations_of(step), task.iterations_of(step));
  }
}

// The shared training path (ModelTask, ParallelModel over the model's BlockModel parts, recycling by the
// batch's iterations) gives a row the loss and gradients of the model's own forward over the same batch's
// iterations (forward(features, geometry): the per-iteration path the AlphaFold golden tests check), in
// float64 where only the same operations run (1e-12 relative), at 1 and 3 recycling iterations; with the
// fine-tuning stage's violation loss on, which the untrained model's atoms give something to penalise.
TEST(FoldTaskTest, TheSharedPathsLossIsTheModelsOwn) {
  FoldSettings settings = tiny_task_settings(20, 2);
  settings.loss.violation_weight = 1.0;
  AlphaFold model = initialized_model(settings);
  {
    torch::NoGradGuard no_grad;  // every branch open, so every parameter has a gradient to compare
    for (auto& p : model->parameters()) p.add_(0.05 * torch::randn(p.sizes()));
  }
  model->to(torch::kFloat64);
  FoldTask task(model, settings, database_chains(3), {}, 2, torch::kCPU);
  std::set<int64_t> seen;
  for (int64_t step = 0; seen.size() < 2 && step < 40; ++step) {
    const int64_t iterations = task.iterations_of(step);
    if (iterations == 2 || seen.count(iterations)) continue;
    seen.insert(iterations);
    SCOPED_TRACE("step " + std::to_string(step) + ", " + std::to_string(iterations) + " iterations");
    const hooks::Batch batch = task.train_batch(step, 1, 1);
    ASSERT_EQ(model->iterations(batch), iterations);
    std::vector<AlphaFoldFeatures> features;
    for (int64_t i = 0; i < iterations; ++i) features.push_back(features_of(iteration_features(batch, i)));
    const ResidueGeometry geometry = ideal_residue_geometry().to(torch::kFloat64);
    const AlphaFoldLoss parts = alphafold_loss(model->forward(features, geometry), labels_of(batch), geometry, model->sizes,
                                               settings.loss);
    EXPECT_GT(parts.violation.item<double>(), 0);
    const torch::Tensor expected = parts.total;
    model->zero_grad();
    expected.backward();
    std::map<std::string, torch::Tensor> reference;
    for (const auto& item : model->named_parameters()) reference[item.key()] = item.value().grad().clone();
    model->zero_grad();
    const torch::Tensor loss = task.loss(step, 1, 1);
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-12 * expected.abs().item<double>());
    for (const auto& item : model->named_parameters()) {
      const torch::Tensor& want = reference.at(item.key());
      EXPECT_LE((item.value().grad() - want).abs().max().item<double>(), 1e-12 * (1 + want.abs().max().item<double>())) << item.key();
    }
  }
  EXPECT_EQ(seen, (std::set<int64_t>{1, 3}));
}

// An example as a batch of named features: each iteration's features and the labels come back as they went in.
TEST(FoldTaskTest, AnExampleTravelsAsNamedFeatures) {
  FoldSettings settings;
  const FoldChain chain = crop_chain(database_chains(1)[0], 0, 30);
  torch::Generator generator = at::detail::createCPUGenerator(4);
  const FoldExample example = make_example(chain, ideal_residue_geometry(), {8, 8}, 3, 0.9, generator);
  const hooks::Batch batch = alphafold_batch(example.iterations, &example.labels);
  ASSERT_EQ(batch_iterations(batch), 3);
  const auto same = [](const torch::Tensor& a, const torch::Tensor& b) { return a.defined() == b.defined() && (!a.defined() || torch::equal(a, b)); };
  for (int64_t i = 0; i < 3; ++i) {
    const AlphaFoldFeatures in = example.iterations[static_cast<size_t>(i)], out = features_of(iteration_features(batch, i));
    for (const auto& [a, b] : {std::pair{in.aatype, out.aatype}, {in.residue_index, out.residue_index}, {in.seq_mask, out.seq_mask},
                               {in.target_feat, out.target_feat}, {in.msa_feat, out.msa_feat}, {in.msa_mask, out.msa_mask},
                               {in.extra_msa, out.extra_msa}, {in.extra_has_deletion, out.extra_has_deletion},
                               {in.extra_deletion_value, out.extra_deletion_value}, {in.extra_msa_mask, out.extra_msa_mask}})
      EXPECT_TRUE(same(a, b)) << "iteration " << i;
  }
  const AlphaFoldLabels in = example.labels, out = labels_of(iteration_features(batch, 2));
  const StructureLabels &s = in.structure, &t = out.structure;
  for (const auto& [a, b] : {std::pair{in.positions, out.positions}, {in.mask, out.mask}, {in.pseudo_beta, out.pseudo_beta},
                             {in.pseudo_beta_mask, out.pseudo_beta_mask}, {in.true_msa, out.true_msa}, {in.bert_mask, out.bert_mask},
                             {s.aatype, t.aatype}, {s.residue_mask, t.residue_mask}, {s.atom14_positions, t.atom14_positions},
                             {s.atom14_exists, t.atom14_exists}, {s.atom14_alt_positions, t.atom14_alt_positions},
                             {s.atom14_alt_exists, t.atom14_alt_exists}, {s.atom14_ambiguous, t.atom14_ambiguous},
                             {s.atom14_type_exists, t.atom14_type_exists}, {s.group_frames.rotation, t.group_frames.rotation},
                             {s.group_frames.translation, t.group_frames.translation},
                             {s.alt_group_frames.rotation, t.alt_group_frames.rotation},
                             {s.alt_group_frames.translation, t.alt_group_frames.translation}, {s.group_exists, t.group_exists},
                             {s.backbone.rotation, t.backbone.rotation}, {s.backbone.translation, t.backbone.translation},
                             {s.backbone_mask, t.backbone_mask}, {s.chi_angles, t.chi_angles}, {s.chi_mask, t.chi_mask}})
    EXPECT_TRUE(same(a, b));
  EXPECT_EQ(out.resolution, in.resolution);
  EXPECT_EQ(t.clamped_fape_fraction, s.clamped_fape_fraction);
}

// The PDB file of a prediction holds every heavy atom of each residue at its predicted place (to the
// file's 3 decimals) with the residue's pLDDT as B-factors.
TEST(FoldAppTest, APredictedStructureWritesAndReadsBack) {
  const FoldChain chain = database_chains(1)[0];
  const int64_t n = chain.aatype.size(0);
  auto g = at::detail::createCPUGenerator(1);
  const torch::Tensor atom37 = torch::randn({n, kAtom37, 3}, g) * 20;
  const torch::Tensor plddt = torch::rand({n}, g) * 100;
  const std::string path = ::testing::TempDir() + "/predicted.pdb";
  fs::remove(path);
  write_pdb(predicted_structure(chain.sequence, chain.residue_index, atom37, plddt), path);
  const ChainAtoms back = chain_atoms(read_pdb(path).chains.at(0));
  EXPECT_EQ(back.sequence, chain.sequence);
  EXPECT_TRUE(torch::equal(back.residue_index, chain.residue_index));
  const torch::Tensor exists = ideal_residue_geometry().atom37_exists.index_select(0, chain.aatype);
  EXPECT_TRUE(torch::equal(back.mask, exists));
  EXPECT_LT((back.positions - atom37 * exists.unsqueeze(-1)).abs().max().item<float>(), 5e-4);
  const Structure read = read_pdb(path);
  for (int64_t r = 0; r < n; ++r)
    EXPECT_NEAR(read.chains[0].residues[static_cast<size_t>(r)].atoms[0].b_factor, plddt[r].item<double>(), 0.005);
}

// A query without a truth (a FASTA) is predicted, with pLDDT in [0, 100] for every residue and no scores.
TEST(FoldAppTest, PredictsAQueryWithoutATruth) {
  const std::string fasta = ::testing::TempDir() + "/query.fasta";
  std::ofstream(fasta) << ">query\nMKTAYIAKQRQISFVKSHFSRQ\n";
  FoldSettings settings;
  settings.model = testing::golden_tiny_sizes();
  AlphaFold model = initialized_model(settings);
  const Prediction p = predict_chain(*model, query_chain(fasta, "", ""), settings, 2, 0, torch::kCPU);
  ASSERT_EQ(p.plddt.size(0), 22);
  EXPECT_GE(p.plddt.min().item<float>(), 0.0f);
  EXPECT_LE(p.plddt.max().item<float>(), 100.0f);
  EXPECT_EQ(p.scores.residues, 0);
  EXPECT_EQ(p.loss, 0.0) << "no truth, no loss";
  EXPECT_TRUE(torch::isfinite(p.outputs.atom37).all().item<bool>());
}

// The database's HHblits profiles in AlphaFold's classes: the query's own residue is the most frequent in
// about half the columns of chain 4915 (a scrambled mapping would leave 1 in 20), and rows drawn from a
// profile follow it (20,000 draws a column: within 0.02 of each frequency).
TEST(FoldDataTest, ProfileRowsFollowTheDatabasesProfile) {
  static const StructureDb db = read_structure_db(kDebianStructureDb);
  const fs::path dir = fs::path(::testing::TempDir()) / "fold_profiles";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "chains.tsv") << "chain_id\tdb_index\tlength\tsplit\tcluster\tgroup\nX\t4915\t58\ttrain\tX\tX\n";
  const FoldChain chain = read_prepared_split(dir.string(), "train", db, /*with_profiles=*/true).at(0);
  ASSERT_EQ(chain.profile.sizes(), (std::vector<int64_t>{chain.aatype.size(0), kResidueTypes + 1}));
  const double agree = (chain.profile.argmax(-1) == chain.aatype).to(torch::kFloat64).mean().item<double>();
  std::cout << "  columns whose most frequent residue is the query's: " << agree << "\n";
  EXPECT_GT(agree, 0.4);  // measured 0.53; a scrambled mapping gives about 1/20
  auto generator = at::detail::createCPUGenerator(2);
  const MsaTensors rows = profile_rows(chain, 20000, generator);
  const torch::Tensor frequencies = torch::one_hot(rows.rows, kResidueTypes + 1).to(torch::kFloat32).mean(0);  // [R, 21]
  const torch::Tensor expected = chain.profile / chain.profile.sum(-1, true);
  EXPECT_LT((frequencies - expected).abs().max().item<float>(), 0.02);
}

// A prepared folder read through its feature cache gives the chains its sources give, tensor for tensor,
// without opening the structure database; a cache made from another chains.tsv is passed over, and one
// that is not HDF5 is named.
TEST(FoldDataTest, TheFeatureCacheGivesTheSourcesChains) {
  static const StructureDb db = read_structure_db(kDebianStructureDb);
  const fs::path dir = fs::path(::testing::TempDir()) / "fold_feature_cache";
  fs::remove_all(dir);
  fs::create_directories(dir / "msas");
  const std::vector<size_t> indices = {4915, 100, 997, 1994};
  std::ofstream table(dir / "chains.tsv");
  table << "chain_id\tdb_index\tlength\tsplit\tcluster\tgroup\n";
  for (size_t i = 0; i < indices.size(); ++i) {
    const std::string id = "C" + std::to_string(i), sequence = db.chain(indices[i]).sequence;
    table << id << "\t" << indices[i] << "\t" << sequence.size() << "\t" << (i < 3 ? "train" : "val") << "\tx\tx\n";
    if (i % 2 == 1) continue;  // the others without an a3m: the sequence alone
    // Two more rows: one with a gap and insertions (deletion counts 2 and 1), one a shifted copy.
    std::string gapped = sequence, shifted = sequence.substr(1) + "A";
    gapped[3] = '-';
    gapped.insert(6, "kl");
    gapped.insert(10, "m");
    std::ofstream(dir / "msas" / (id + ".a3m")) << ">" << id << "\n" << sequence << "\n>h1\n" << gapped << "\n>h2\n" << shifted << "\n";
  }
  table.close();
  const auto splits = [&](const DatabaseSource& source) {
    std::vector<FoldChain> all = read_prepared_split(dir.string(), "train", source, /*with_profiles=*/true);
    for (FoldChain& c : read_prepared_split(dir.string(), "val", source, /*with_profiles=*/true)) all.push_back(std::move(c));
    return all;
  };
  const std::vector<FoldChain> sources = splits(db);
  const std::string cache = write_prepared_cache(dir.string(), db);
  EXPECT_EQ(fs::path(cache).filename(), kFeatureCacheFile);
  // A database that does not exist: reading it would fail, so every chain below comes from the cache.
  const DatabaseSource nowhere = DatabaseSource::file((dir / "no_database.dat").string());
  const std::vector<FoldChain> cached = splits(nowhere);
  ASSERT_EQ(cached.size(), sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const FoldChain &a = cached[i], &b = sources[i];
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.sequence, b.sequence);
    EXPECT_EQ(a.dssp, b.dssp);
    for (const auto& [x, y, what] : {std::tuple{a.aatype, b.aatype, "aatype"}, {a.residue_index, b.residue_index, "residue_index"},
                                     {a.positions, b.positions, "positions"}, {a.mask, b.mask, "mask"}, {a.profile, b.profile, "profile"},
                                     {a.msa.rows, b.msa.rows, "msa rows"}, {a.msa.deletions, b.msa.deletions, "deletions"}}) {
      EXPECT_TRUE(x.scalar_type() == y.scalar_type() && torch::equal(x, y)) << a.id << " " << what;
    }
  }
  EXPECT_EQ(sources[0].msa.deletions.max().item<float>(), 2.0f);  // the a3m's insertions counted
  EXPECT_TRUE(read_prepared_chain(dir.string(), "C2", nowhere).msa.rows.size(0) == 3);
  // chains.tsv changed after the cache was made: the cache is passed over (the sources are read again).
  std::ofstream(dir / "chains.tsv", std::ios::app) << "C9\t5\t" << db.chain(5).sequence.size() << "\tval\tx\tx\n";
  EXPECT_THROW(read_prepared_split(dir.string(), "val", nowhere), Error);
  EXPECT_EQ(read_prepared_split(dir.string(), "val", db).size(), 2u);
  // A cache file that is not HDF5 is named.
  std::ofstream(cache, std::ios::trunc) << "not hdf5";
  try {
    read_prepared_split(dir.string(), "val", db);
    ADD_FAILURE() << "a corrupt feature cache was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("features.h5"), std::string::npos) << e.what();
  }
}

// Every config the app ships loads against the schema with its cross-key checks, and alphafold.toml describes
// AlphaFold 2's model (48 blocks, crops of 256) of about 93M parameters, as commonly cited for it (Kuafu models
// no templates: within 90-95M), counted on a model described on the meta device.
TEST(FoldConfigsTest, EveryShippedConfigValidates) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(KUAFU_SOURCE_DIR) / "apps/fastfold/configs")) {
    SCOPED_TRACE(entry.path().string());
    const config::Config config = config::Config::load(entry.path().string(), fold_schema());
    const FoldSettings settings = read_fold_settings(config);
    AlphaFold described(settings.model, parallel::ModelOptions::serial_on(torch::kMeta));
    int64_t parameters = 0;
    for (const auto& p : described->parameters()) parameters += p.numel();
    std::cout << "  " << entry.path().filename().string() << ": " << parameters << " parameters\n";
    if (entry.path().filename() == "alphafold.toml") {
      EXPECT_EQ(settings.model.evoformer_blocks, 48);
      EXPECT_EQ(settings.crop_size, 256);
      EXPECT_GT(parameters, 90'000'000);
      EXPECT_LT(parameters, 95'000'000);
      EXPECT_EQ(settings.loss.violation_weight, 0.0);
      EXPECT_TRUE(settings.model.experimentally_resolved_head);  // carried untrained, for the fine-tuning stage
      EXPECT_EQ(settings.loss.experimentally_resolved_weight, 0.0);
    }
    if (entry.path().filename() == "alphafold_finetune.toml") {  // the same model, longer crops, the violations on
      EXPECT_EQ(settings.model.evoformer_blocks, 48);
      EXPECT_EQ(settings.crop_size, 384);
      EXPECT_EQ(settings.sampling.max_clusters, 512);
      EXPECT_EQ(settings.sampling.max_extra, 5120);
      EXPECT_EQ(settings.loss.violation_weight, 1.0);
      EXPECT_EQ(settings.loss.experimentally_resolved_weight, 0.01);
    }
    ++count;
  }
  EXPECT_GE(count, 3);
  // A loss weight on a head the model is not made with is named.
  const fs::path tiny = fs::path(KUAFU_SOURCE_DIR) / "apps/fastfold/configs/tiny.toml";
  try {
    read_fold_settings(config::Config::load(tiny.string(), fold_schema(), {"loss.experimentally_resolved=0.01"}));
    ADD_FAILURE() << "a loss without its head was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss.experimentally_resolved"), std::string::npos) << e.what();
  }
}

TEST(FoldAppTest, BadInputsAreNamed) {
  const fs::path dir = fs::path(::testing::TempDir()) / "fold_bad_inputs";
  fs::remove_all(dir);
  fs::create_directories(dir / "msas");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const auto message = [](const std::function<void()>& body) {
    try {
      body();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string fasta = write("query.fasta", ">q\nACDEFGHIK\n");
  EXPECT_NE(message([&] { query_chain("", "", ""); }).find("--fasta"), std::string::npos);
  EXPECT_NE(message([&] { query_chain(fasta, "", write("other.a3m", ">o\nKIHGFEDCA\n")); }).find("other.a3m"), std::string::npos);
  write("chains.tsv", "chain_id\tdb_index\tlength\tsplit\tcluster\tgroup\n1ABC_A\tnot-a-number\t50\ttrain\tx\tx\n");
  static const StructureDb db = read_structure_db(kDebianStructureDb);
  const std::string bad_index = message([&] { read_prepared_split(dir.string(), "train", db); });
  EXPECT_NE(bad_index.find("chains.tsv:2"), std::string::npos) << bad_index;
  write("chains.tsv", "chain_id\tdb_index\tlength\tsplit\tcluster\tgroup\n1ABC_A\t0\t50\ttrain\tx\tx\n");
  write("msas/1ABC_A.a3m", ">q\nAAAA\n");
  const std::string bad_msa = message([&] { read_prepared_split(dir.string(), "train", db); });
  EXPECT_NE(bad_msa.find("1ABC_A.a3m"), std::string::npos) << bad_msa;
  EXPECT_NE(message([&] { read_prepared_split((dir / "missing").string(), "train", db); }).find("kuafu-fold prepare"), std::string::npos);
}

}  // namespace
}  // namespace kuafu::fold

#include "apps/fastfold/commands.h"

#include <chrono>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <torch/torch.h>

#include "apps/fastfold/alignment_files.h"
#include "apps/fastfold/alphafold_flops.h"
#include "apps/fastfold/chain_atoms.h"
#include "apps/fastfold/data_recipe.h"
#include "apps/fastfold/fold_settings.h"
#include "apps/fastfold/fold_task.h"
#include "apps/fastfold/pdb_file.h"
#include "apps/fastfold/residue_types.h"
#include "core/io/npz.h"
#include "core/memory/memory_meter.h"
#include "core/train/held_model.h"
#include "core/train/model_app.h"
#include "core/train/parallelize.h"
#include "core/util/atomic_file.h"
#include "core/util/device.h"
#include "core/util/error.h"
#include "core/util/logging.h"

namespace kuafu::fold {
namespace {

int64_t parameter_count(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

class FoldApp : public train::ModelApp<AlphaFold> {
 public:
  explicit FoldApp(const config::Config& config) : ModelApp(config), settings_(read_fold_settings(config)) {}

  std::unique_ptr<train::RunTask> make_task(const parallel::ModelOptions& options, const train::Runtime* runtime) override {
    const DatabaseSource db = DatabaseSource::file(settings_.structure_db);  // read only without a current feature cache
    const bool profiles = settings_.profile_rows > 0;
    std::vector<FoldChain> train = read_prepared_split(settings_.data_dir, "train", db, profiles);
    std::vector<FoldChain> val = read_prepared_split(settings_.data_dir, "val", db, profiles);
    KUAFU_CHECK(!train.empty(), settings_.data_dir, " has no training chains (run `kuafu-fold prepare`)");
    const train::TrainSettings t = train::read_train_settings(config_);
    train::require_data_parallel(config_, runtime, options, "kuafu-fold train");
    // Each row of a micro-batch is its own forward (chains differ in length), and Gemini's hooks take one
    // forward per block between backwards.
    if (config_.get_string("memory.strategy") == "gemini" && config_.get_int("train.micro_batch_size") > 1) {
      config_.fail_at("train.micro_batch_size", "is " + std::to_string(config_.get_int("train.micro_batch_size")) +
                                                     " but memory.strategy = \"gemini\" needs 1 in kuafu-fold (each row is a "
                                                     "forward of its own); accumulate rows with train.batch_size instead");
    }
    // Described, then given storage and drawn on the run's device, or, under ZeRO and Gemini, left described
    // for the strategy to fill its chunks from the draws and model.init_from's file.
    const train::Purpose purpose = runtime ? train::Purpose::train : train::Purpose::evaluate;
    train::Built<AlphaFold> built = train::build(recipe(), config_, {purpose, options});
    // Its blocks run over options.dap (the run's DAP group) from the start; ParallelModel checkpoints them
    // as the config says (by default every block: the extra-MSA stack's and the Evoformer's).
    const train::ParallelOptions parallel = runtime ? train::parallel_options(*built.model, config_, *runtime, {}) : train::ParallelOptions{};
    auto task = std::make_unique<FoldTask>(built.model, settings_, std::move(train), std::move(val), t.batch_size, options.device,
                                           parallel);
    if (built.deferred) task->defer_weights(std::move(built.deferred));
    return task;
  }

  std::string describe(train::RunTask& task) override {
    auto& fold = dynamic_cast<FoldTask&>(task);
    const AlphaFoldSizes& m = settings_.model;
    std::ostringstream line;
    line << "AlphaFold: " << m.evoformer_blocks << " Evoformer blocks (c_m " << m.msa_channels << ", c_z " << m.pair_channels
         << "), " << m.extra_msa_blocks << " extra-MSA blocks, " << m.structure.layers << " structure layers, "
         << static_cast<double>(parameter_count(fold.model())) / 1e6 << "M parameters; crops of " << settings_.crop_size
         << " residues, up to " << settings_.max_recycles << " recycles; " << fold.steps_per_epoch() << " steps per epoch, "
         << fold.val_chains().size() << " validation chains";
    const int64_t dap_ranks = fold.alphafold()->layout.parts();
    if (dap_ranks > 1) line << "; every block's MSA and pair cut over " << dap_ranks << " DAP ranks";
    return line.str();
  }

  // The figures over the validation chains, counted as chains (the task's items are residues).
  // eval and export read the weights' moving average where training kept one (what its evaluations scored).
  std::string model_part() const override { return config_.get_float("optim.ema_decay") > 0 ? "ema" : ""; }

  nlohmann::json evaluate(train::RunTask& task, const train::Runtime& runtime) override {
    return train::metrics_line(task, runtime, "chains");
  }

  // A folder with the parameters as DeepMind's params_model_*.npz (AlphaFold, OpenFold and ColabFold read
  // it) and the sizes as kuafu-fold's config keys.
  nlohmann::json export_model(const std::string& out, io::HfWriteOptions, const config::ParsedCommand&) override {
    const io::NpzArrays arrays = alphafold_arrays(*model());
    nlohmann::json sizes;
    for (const char* key : {"model.msa_channels", "model.pair_channels", "model.single_channels", "model.extra_msa_channels",
                            "model.evoformer_blocks", "model.extra_msa_blocks", "model.msa_heads", "model.pair_heads",
                            "model.outer_channels", "model.triangle_channels", "model.structure_channels",
                            "model.structure_layers", "model.ipa_heads", "model.ipa_scalar_channels", "model.ipa_query_points",
                            "model.ipa_value_points", "model.angle_channels", "model.plddt_channels"})
      sizes[key] = config_.get_int(key);
    sizes["model.experimentally_resolved_head"] = config_.get_bool("model.experimentally_resolved_head");
    write_folder_atomic(out, [&](const std::filesystem::path& building) {
      io::write_npz((building / "params_model_kuafu.npz").string(), arrays);
      write_file_atomic((building / "kuafu_fold_model.json").string(), sizes.dump(1) + "\n");
    });
    return {{"params", (std::filesystem::path(out) / "params_model_kuafu.npz").string()}, {"arrays", arrays.size()}};
  }

  nlohmann::json benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) override;

 private:
  // AlphaFold's initial values from train.seed (drawn on the CPU, the same on any device), then
  // model.init_from's parameter file (DeepMind's params_model_*.npz layout) over them.
  train::ModelRecipe<AlphaFold> recipe() const override {
    train::ModelRecipe<AlphaFold> recipe;
    recipe.describe = train::described<AlphaFold>(settings_.model);
    recipe.draw = [seed = train::read_train_settings(config_).seed](AlphaFold& model) {
      torch::manual_seed(seed);
      initialize_alphafold_weights(*model);
    };
    if (!settings_.init_from.empty()) {
      recipe.load = [file = settings_.init_from](AlphaFold& model) {
        const io::NpzArrays params = io::read_npz(file);
        load_alphafold(*model, params);
        log::infof("initial weights from ", file);
        // A head the model was not made with (DeepMind's files carry the experimentally-resolved head, the pTM
        // models the predicted-aligned-error head): said, since an export will not carry it.
        const std::vector<std::string> unused = unused_alphafold_arrays(*model, params);
        if (!unused.empty())
          log::warnf(file, ": ", unused.size(), " arrays the model does not use (first: ", unused.front(),
                     "; model.experimentally_resolved_head = true reads that head's)");
      };
    }
    recipe.parameters = static_cast<double>(parameter_count(*recipe.describe({})));
    recipe.size_keys = {"model."};
    return recipe;
  }

  FoldSettings settings_;
};

// A training step's time on a random chain of data.crop_size residues with the run's MSA sizes and every
// recycling iteration (the slowest step), timed by the shared benchmark.
nlohmann::json FoldApp::benchmark(const train::Runtime& runtime, train::BenchmarkMemory& memory) {
  const int64_t residues = settings_.crop_size;
  torch::Generator generator = at::detail::createCPUGenerator(settings_.seed);
  FoldChain chain;
  chain.aatype = torch::randint(0, kResidueTypes, {residues}, generator, torch::kInt64);
  chain.residue_index = torch::arange(residues);
  chain.positions = torch::randn({residues, kAtom37, 3}, generator) * 10;
  chain.mask = ideal_residue_geometry().atom37_exists.index_select(0, chain.aatype);
  const int64_t rows = std::min<int64_t>(settings_.sampling.max_clusters + settings_.sampling.max_extra, 1 << 14);
  chain.msa = {torch::randint(0, 22, {rows, residues}, generator, torch::kInt64), torch::zeros({rows, residues})};
  chain.msa.rows[0] = chain.aatype;
  const FoldExample example = make_example(chain, ideal_residue_geometry(), settings_.sampling, settings_.max_recycles + 1,
                                           settings_.clamped_fape_fraction, generator);
  train::BenchmarkSpec spec;
  spec.app = "fold";
  spec.item_name = "residues";
  spec.items_per_row = residues;
  const FoldShape shape{residues, settings_.sampling.max_clusters, std::min(settings_.sampling.max_extra, rows - settings_.sampling.max_clusters)};
  spec.flops_per_item = alphafold_training_flops(model()->sizes, shape, static_cast<double>(settings_.max_recycles + 1)) /
                        static_cast<double>(residues);
  spec.parameters = parameter_count(*model());
  spec.deferred = deferred();
  spec.fields = {{"residues", residues}, {"msa_clusters", settings_.sampling.max_clusters},
                 {"extra_msa", settings_.sampling.max_extra}, {"iterations", settings_.max_recycles + 1}};
  // The model's blocks run on this rank's rows of the MSA and the pair (FastFold's DAP), checkpointed as the
  // config says.
  model()->layout = dap::AxialLayout(runtime.dap);
  model()->loss_settings = settings_.loss;
  const torch::Dtype dtype = train::compute_dtype(config_, runtime.device);  // the model is cast to it later
  return train::benchmark_training(config_, runtime, *model(), example_batch(*model(), example, runtime.device, dtype), spec,
                                   memory);
}

}  // namespace

std::unique_ptr<train::App> make_fold_app(const config::Config& config) { return std::make_unique<FoldApp>(config); }

Structure predicted_structure(const std::string& sequence, const torch::Tensor& residue_index, const torch::Tensor& atom37,
                              const torch::Tensor& plddt, const torch::Tensor& atom_mask) {
  const torch::Tensor positions = atom37.detach().to(torch::kCPU, torch::kFloat64);
  Chain chain{"A", {}, {}, {}};
  for (size_t r = 0; r < sequence.size(); ++r) {
    const int type = residue_type_index(sequence[r]);
    Residue residue;
    residue.name = type < kResidueTypes ? residue_types()[type].name : "UNK";
    residue.number = static_cast<int>(residue_index[static_cast<int64_t>(r)].item<int64_t>());
    const double b = plddt[static_cast<int64_t>(r)].item<double>();
    const std::vector<std::string> names =
        type < kResidueTypes ? residue_types()[type].atoms : std::vector<std::string>{"N", "CA", "C", "O"};
    for (const std::string& name : names) {
      if (atom_mask.defined() && atom_mask[static_cast<int64_t>(r)][atom37_index(name)].item<float>() == 0) continue;
      const torch::Tensor p = positions[static_cast<int64_t>(r)][atom37_index(name)];
      residue.atoms.push_back({name, name.substr(0, 1), {p[0].item<double>(), p[1].item<double>(), p[2].item<double>()}, 1.0, b});
    }
    chain.residues.push_back(std::move(residue));
  }
  Structure structure;
  structure.chains.push_back(std::move(chain));
  return structure;
}

FoldChain query_chain(const std::string& fasta, const std::string& pdb, const std::string& a3m) {
  KUAFU_CHECK(fasta.empty() != pdb.empty(), "predict needs one of --fasta FILE and --pdb FILE (the query's sequence)");
  FoldChain chain;
  if (!fasta.empty()) {
    const Msa read = read_alignment(fasta, AlignmentFormat::kFasta);
    KUAFU_CHECK(!read.sequences.empty(), fasta, ": no sequence");
    chain.id = read.descriptions[0];
    chain.sequence = read.sequences[0];
    for (const char c : chain.sequence)
      KUAFU_CHECK(std::isupper(static_cast<unsigned char>(c)), fasta, ": the query has '", std::string(1, c), "', not a residue letter");
  } else {
    const Structure structure = read_pdb(pdb);
    KUAFU_CHECK(!structure.chains.empty(), pdb, ": no chain");
    const ChainAtoms atoms = chain_atoms(structure.chains[0]);
    chain.id = structure.chains[0].id;
    chain.sequence = atoms.sequence;
  }
  const int64_t n = static_cast<int64_t>(chain.sequence.size());
  KUAFU_CHECK(n > 0, "the query has no residues");
  chain.aatype = torch::empty({n}, torch::kInt64);
  for (int64_t r = 0; r < n; ++r) chain.aatype[r] = residue_type_index(chain.sequence[static_cast<size_t>(r)]);
  chain.residue_index = torch::arange(1, n + 1);
  chain.positions = torch::zeros({n, kAtom37, 3});
  chain.mask = torch::zeros({n, kAtom37});
  chain.msa = {chain.aatype.unsqueeze(0), torch::zeros({1, n})};
  if (!a3m.empty()) {
    const Msa msa = read_alignment(a3m, AlignmentFormat::kA3m);
    KUAFU_CHECK(msa.sequences[0] == chain.sequence, a3m, ": its first row is not the query's sequence (", chain.sequence, ")");
    chain.msa = msa_tensors(msa);
  }
  return chain;
}

namespace {

void predict_command(const config::Config& config, const config::ParsedCommand& command) {
  const std::string out = command.option("out"), truth = command.option("truth"), id = command.option("chain");
  KUAFU_CHECK(!out.empty(), "predict needs --out FILE.pdb");
  for (const std::string& file : {out, truth}) KUAFU_CHECK(file.empty() || !std::filesystem::exists(file), file, " exists: predict writes new files");
  KUAFU_CHECK(truth.empty() || !id.empty(), "--truth needs --chain (a prepared chain has a truth to write)");
  const FoldSettings settings = read_fold_settings(config);
  const FoldChain chain = id.empty() ? query_chain(command.option("fasta"), command.option("pdb"), command.option("a3m"))
                                     : read_prepared_chain(settings.data_dir, id, DatabaseSource::file(settings.structure_db),
                                                           settings.profile_rows > 0);
  // Under the launcher with parallel.dap.size = the number of ranks, every rank predicts the chain on its
  // rows of the MSA and pair (FastFold's DAP inference: each holds 1/n of the activations); rank 0 writes.
  const train::Runtime runtime = train::start_runtime(config);
  const bool several = runtime.world->size() > 1;
  KUAFU_CHECK(!several || (runtime.dap && runtime.dap->size() == runtime.world->size()), "predict on ", runtime.world->size(),
              " ranks needs parallel.dap.size = ", runtime.world->size(), " (each rank takes its share of the one chain)");
  auto fold = make_fold_app(config);
  const torch::Device device = several ? runtime.device : resolve_device(command.option("device"), 0);
  torch::nn::Module& model = fold->build_model(device, /*starting_weights=*/true);
  const std::string from = train::load_checkpoint_weights(config, command.option("checkpoint"), model, fold->model_part());
  auto& alphafold = dynamic_cast<AlphaFoldImpl&>(model);
  alphafold.eval();
  // precision.dtype = "bf16": the trunk (embedders, extra-MSA stack, Evoformer) in bf16, half the bytes of
  // the pair at long lengths; the structure module and the heads stay in float32.
  const torch::Dtype trunk = train::compute_dtype(config, device);
  KUAFU_CHECK(trunk != torch::kFloat16, "precision.dtype = \"fp16\": predict runs the trunk in \"bf16\" or \"fp32\" (AlphaFold's "
              "masks of -1e9 overflow float16)");
  alphafold.evoformer->to(trunk);
  alphafold.layout = dap::AxialLayout(runtime.dap);
  const auto start = std::chrono::steady_clock::now();
  const Prediction p = predict_chain(alphafold, chain, settings, settings.max_recycles + 1, settings.seed, device);
  synchronize(device);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!runtime.is_main()) return;
  write_pdb(predicted_structure(chain.sequence, chain.residue_index, p.outputs.atom37, p.plddt), out);
  nlohmann::json line = {{"out", out}, {"weights", from}, {"residues", chain.sequence.size()},
                         {"msa_rows", chain.msa.rows.size(0)}, {"mean_plddt", p.plddt.mean().item<double>()},
                         {"device", device.str()}, {"seconds", seconds},
                         // the GPU allocator's peak, or on the CPU the process's peak resident set
                         {"peak_mb", static_cast<double>(memory::peak_bytes(device)) / (1 << 20)},
                         // fractions of residues breaking a peptide bond, clashing, out of bounds within, any
                         {"violations", {{"bond", p.violations.bond}, {"clash", p.violations.clash},
                                         {"within", p.violations.within}, {"any", p.violations.any}}},
                         {"violation_loss", p.violation_loss}};
  if (!id.empty()) {
    line["lddt_ca"] = p.scores.lddt_ca;
    line["tm_score"] = p.scores.tm_score;
    line["gdt_ts"] = p.scores.gdt_ts;
    line["rmsd_ca"] = p.scores.rmsd_ca;
    if (!truth.empty()) {
      write_pdb(predicted_structure(chain.sequence, chain.residue_index, chain.positions, torch::zeros({chain.aatype.size(0)}),
                                    chain.mask), truth);
      line["truth"] = truth;
    }
  }
  std::cout << line.dump() << std::endl;
}

}  // namespace

int run_fold_app(int argc, const char* const argv[]) {
  train::AppDefinition app;
  app.program = "kuafu-fold";
  app.description = "AlphaFold 2 protein structure training and prediction (FastFold)";
  app.schema = fold_schema();
  app.make_app = make_fold_app;
  app.before = {
      {"prepare", "choose chains from ProMod3's structure database, split them by sequence identity and build their MSAs (mmseqs2)",
       [](const config::Config& config, const config::ParsedCommand&) {
         const DataRecipeOptions options = read_recipe_options(config);
         const DataRecipeSummary s = run_data_recipe(options);
         const auto start = std::chrono::steady_clock::now();
         const std::string cache = write_prepared_cache(options.out_dir, DatabaseSource::file(options.structure_db));
         const double cache_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
         std::cout << nlohmann::json{{"dir", options.out_dir}, {"chains", s.chains}, {"clusters", s.clusters},
                                     {"groups", s.groups}, {"train", s.split_chains[0]}, {"val", s.split_chains[1]},
                                     {"test", s.split_chains[2]}, {"msa_median_depth", s.msa_median_depth},
                                     {"feature_cache", cache}, {"cache_seconds", cache_seconds},
                                     {"seconds", s.total_seconds + cache_seconds}}.dump()
                   << std::endl;
       }},
      {"predict", "predict a structure from a sequence (--fasta, --pdb or a prepared --chain) and an MSA (--a3m) into a PDB "
                  "file (--out; pLDDT as B-factors)",
       [](const config::Config& config, const config::ParsedCommand& command) { predict_command(config, command); }}};
  app.add_options = [](config::CommandLine& cli) {
    cli.option("predict", "fasta", "FILE", "", "the query's sequence (its first)");
    cli.option("predict", "pdb", "FILE", "", "or a PDB file whose first chain's sequence is the query");
    cli.option("predict", "a3m", "FILE", "", "the query's MSA (its first row the query); none: the sequence alone");
    cli.option("predict", "chain", "ID", "", "or a chain of data.dir (its sequence and MSA), scored against its truth");
    cli.option("predict", "truth", "FILE", "", "with --chain: also write its true backbone as a PDB file (new)");
    cli.option("predict", "device", "DEV", "cpu", "cpu, cuda or cuda:N");
    cli.option("predict", "out", "FILE", "", "the PDB file to write (new)");
    cli.option("predict", "checkpoint", "DIR", "", "a checkpoint folder; empty: the latest in train.out_dir; init: model.init_from");
  };
  app.item_help = "a random chain of data.crop_size residues with every recycling iteration";
  app.export_help = "a folder with params_model_kuafu.npz, DeepMind's parameter layout (AlphaFold, OpenFold, ColabFold read it)";
  app.eval_help = "loss, lDDT-Ca, TM-score, GDT-TS, Ca RMSD, pLDDT's correlation with lDDT and the residues with violations on the validation chains";
  return train::run_app(app, argc, argv);
}

}  // namespace kuafu::fold

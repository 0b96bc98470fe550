#include "core/train/checkpoint.h"

#include <c10/util/accumulate.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iomanip>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "core/dist/collectives.h"
#include "core/io/safetensors.h"
#include "core/train/checkpoint_manifest.h"
#include "core/util/atomic_file.h"
#include "core/util/device.h"
#include "core/util/error.h"
#include "core/util/logging.h"
#include "core/util/text.h"

namespace kuafu::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kManifest = kManifestFile;
constexpr const char* kModel = "model";  // kinds of a part's files (checkpoint_shards.h)
constexpr const char* kOptimizer = "optimizer";
constexpr const char* kTrainer = "trainer.json";

std::string rng_file(int rank) { return "rng_rank" + std::to_string(rank) + ".safetensors"; }
std::string task_state_file(int rank) { return "task_rank" + std::to_string(rank) + ".safetensors"; }
constexpr const char* kPartialSuffix = ".partial";  // step_N.partial: a save being written

// What each rank wrote in a save: the manifest's entries, handed to rank 0 through the folder.
std::string sums_file(int rank) { return "sums_rank" + std::to_string(rank) + ".json"; }

// The step of a checkpoint folder's name "step_<digits>", or none for any other name.
std::optional<int64_t> step_of_name(const std::string& name) {
  constexpr size_t kPrefix = 5;  // "step_"
  if (name.rfind("step_", 0) != 0 || name.size() <= kPrefix || name.size() > kPrefix + 12) return std::nullopt;
  if (name.find_first_not_of("0123456789", kPrefix) != std::string::npos) return std::nullopt;
  return std::stoll(name.substr(kPrefix));
}

// The step_N folders under `root` (real folders, not links), by step.
std::vector<std::pair<int64_t, fs::path>> step_folders(const std::string& root) {
  std::vector<std::pair<int64_t, fs::path>> folders;
  if (!fs::is_directory(root)) return folders;
  for (const auto& entry : fs::directory_iterator(root)) {
    const auto step = step_of_name(entry.path().filename().string());
    if (step && entry.is_directory() && !entry.is_symlink()) folders.emplace_back(*step, entry.path());
  }
  std::sort(folders.begin(), folders.end());
  return folders;
}

// The error the lowest-numbered rank of `group` met (each its own or none), on every rank; none when no
// rank met one. Collective: every rank then stops (or goes on) alike, with the same words.
std::optional<std::string> first_error_on_any_rank(const std::optional<std::string>& mine, const dist::ProcessGroup& group) {
  if (group.size() == 1) return mine;
  const auto ints = torch::TensorOptions(torch::kInt64).device(group.device());
  torch::Tensor first = torch::tensor({static_cast<int64_t>(mine ? group.rank() : group.size())}, ints);
  dist::all_reduce(first, group, dist::Reduce::kMin);
  const int from = static_cast<int>(first.item<int64_t>());
  if (from == group.size()) return std::nullopt;
  constexpr int64_t kLongest = 4096;  // bytes of the message passed on
  torch::Tensor length = torch::tensor({mine ? std::min<int64_t>(static_cast<int64_t>(mine->size()), kLongest) : 0}, ints);
  dist::broadcast(length, group, from);
  torch::Tensor bytes = torch::zeros({length.item<int64_t>()}, ints.dtype(torch::kUInt8));
  if (group.rank() == from) std::memcpy(bytes.data_ptr(), mine->data(), static_cast<size_t>(bytes.numel()));
  bytes = bytes.to(group.device());
  dist::broadcast(bytes, group, from);
  bytes = bytes.cpu();
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
}

// verify_manifest reads every byte of a checkpoint (8.6 GB at 749M parameters), and a resume reads the
// trainer state and then each model's part: a folder is verified once while its files stay as they were
// (the same manifest, and each file of the same size and modification time). With `share` (collective)
// its ranks split the CRC checks, each file read by one of them, and agree on the verdict.
nlohmann::json verified_manifest(const std::string& folder, const dist::ProcessGroup* share = nullptr) {
  static std::mutex mutex;
  static std::map<std::string, nlohmann::json> verified;
  std::string key = fs::absolute(folder).string();
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    const auto written = fs::last_write_time(entry.path(), error).time_since_epoch().count();
    key += "\n" + entry.path().filename().string() + " " + std::to_string(entry.is_regular_file(error) ? entry.file_size(error) : 0) +
           " " + std::to_string(written);
  }
  std::optional<nlohmann::json> cached;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto found = verified.find(key); found != verified.end()) cached = found->second;
  }
  const bool shared = share && share->size() > 1;
  // A shared check runs on every rank or on none: a rank whose cache misses brings the others along.
  const bool check = shared ? on_any_rank(!cached, *share) : !cached;
  if (!check) return *cached;
  nlohmann::json manifest;
  if (shared) {
    std::optional<std::string> mine;
    try {
      manifest = verify_manifest(folder, {share->rank(), share->size()});
    } catch (const Error& e) {
      mine = e.what();
    }
    if (const auto first = first_error_on_any_rank(mine, *share)) throw Error(*first);
  } else {
    manifest = verify_manifest(folder);
  }
  std::lock_guard<std::mutex> lock(mutex);
  verified[key] = manifest;
  return manifest;
}

// This rank's part of saved tensor `name` (the whole tensor without one), in the shape it is held in.
torch::Tensor part_of(const SavedTensors& saved, const std::string& name,
                      const std::optional<CheckpointStore::LocalPart>& part) {
  if (!part) return saved.read(name);
  return saved.read_piece(name, part->place, c10::multiply_integers(part->shape)).view(part->shape);
}

// `part`: the model is a pipeline stage's part, so the checkpoint may hold other stages' tensors. One
// tensor at a time, only this rank's part of it read from the saved pieces.
void restore_weights(const std::string& folder, const io::NamedTensors& weights, const CheckpointStore::PlaceOf& place_of,
                     bool part, const std::string& part_name,
                     const std::function<void(const std::string&, const torch::Tensor&)>& store = nullptr,
                     const std::function<void(const std::string&)>& before_store = nullptr) {
  const SavedTensors saved(folder, part_name, kModel);
  const std::string& path = saved.where();
  torch::NoGradGuard no_grad;
  std::vector<std::string> missing;
  size_t matched = 0;
  for (const auto& [name, target] : weights) {
    if (!saved.contains(name)) {
      missing.push_back(name);
      continue;
    }
    const auto local_part = place_of ? place_of(name) : std::nullopt;
    const std::vector<int64_t> expected = local_part ? local_part->place.shape : target.sizes().vec();
    KUAFU_CHECK(saved.shape(name) == expected, path, ": '", name, "' has shape ", torch::IntArrayRef(saved.shape(name)),
                " but the model expects ", torch::IntArrayRef(expected), " (checkpoint from a different model config?)");
    const torch::Tensor local = part_of(saved, name, local_part);
    KUAFU_CHECK(local.sizes() == target.sizes(), "loading '", name, "': its part here has shape ", local.sizes(),
                " but the model's has ", target.sizes());
    // Only this rank's part is checked (NaN, infinity, narrowing): a rank that refuses exits, and the
    // others end at their next collective (core/dist/deadline.h).
    io::check_loadable(path, name, local, target);
    if (before_store) before_store(name);
    if (target.is_meta()) {
      KUAFU_CHECK(store, "loading '", name, "': a target of no memory needs the loader's store");
      store(name, local);
    } else {
      target.copy_(local);
    }
    ++matched;
  }
  KUAFU_CHECK(missing.empty(), path, ": missing ", missing.size(), " tensors the model needs, e.g. '",
              missing.empty() ? "" : missing.front(), "'");
  KUAFU_CHECK(part || matched == saved.names().size(), path, ": holds ", saved.names().size() - matched,
              " tensors the model does not have (checkpoint from a different model?)");
}

}  // namespace

io::NamedTensors named_weights(const torch::nn::Module& model) {
  io::NamedTensors out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

void copy_named_weights(const io::NamedTensors& weights, torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> targets;
  for (const auto& [name, tensor] : named_weights(model)) targets.emplace(name, tensor);
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : weights) {
    const auto target = targets.find(name);
    KUAFU_CHECK(target != targets.end(), "the model has no tensor '", name, "' to copy into");
    KUAFU_CHECK(target->second.sizes() == tensor.sizes(), "'", name, "' has shape ", tensor.sizes(), " but the model's has ",
                target->second.sizes());
    target->second.copy_(tensor);
    targets.erase(target);
  }
  KUAFU_CHECK(targets.empty(), "nothing was copied into the model's '", targets.empty() ? "" : targets.begin()->first, "'");
}

io::NamedTensors gather_pipeline_stages(io::NamedTensors mine, const dist::ProcessGroup& pipeline) {
  const auto on_group = torch::TensorOptions().device(pipeline.device());  // what the backend moves
  if (pipeline.rank() > 0) {
    // Names, dtypes and shapes first (as JSON bytes, after their length), then the tensors in order.
    nlohmann::json listing = nlohmann::json::array();
    for (const auto& [name, tensor] : mine) {
      listing.push_back({{"name", name}, {"dtype", static_cast<int>(tensor.scalar_type())}, {"shape", tensor.sizes().vec()}});
    }
    const std::string text = listing.dump();
    dist::send(torch::tensor({static_cast<int64_t>(text.size())}, on_group), pipeline, 0);
    dist::send(torch::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())}, torch::kUInt8)
                   .to(pipeline.device()),
               pipeline, 0);
    for (const auto& item : mine) dist::send(item.second.to(pipeline.device()).contiguous(), pipeline, 0);
    return mine;
  }
  std::set<std::string> held;
  for (const auto& item : mine) held.insert(item.first);
  for (int stage = 1; stage < pipeline.size(); ++stage) {
    torch::Tensor length = torch::zeros({1}, on_group.dtype(torch::kInt64));
    dist::recv(length, pipeline, stage);
    torch::Tensor bytes = torch::empty({length.item<int64_t>()}, on_group.dtype(torch::kUInt8));
    dist::recv(bytes, pipeline, stage);
    bytes = bytes.cpu();
    const auto listing = nlohmann::json::parse(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
    for (const auto& entry : listing) {
      torch::Tensor tensor = torch::empty(entry.at("shape").get<std::vector<int64_t>>(),
                                          on_group.dtype(static_cast<torch::ScalarType>(entry.at("dtype").get<int>())));
      dist::recv(tensor, pipeline, stage);
      // A tensor two stages hold (the tied embedding, the optimizer's step) is kept once.
      if (held.insert(entry.at("name").get<std::string>()).second) mine.emplace_back(entry.at("name"), tensor);
    }
  }
  return mine;
}

std::string checkpoint_to_read(const std::string& out_dir, const std::string& requested) {
  if (!requested.empty()) return requested;
  const std::string root = (fs::path(out_dir) / "checkpoints").string();
  CheckpointStore store(root, dist::World::single()->world_group(), 1);
  const auto latest = store.latest();
  KUAFU_CHECK(latest, "no checkpoint in ", root, ": train first or pass --checkpoint");
  return *latest;
}

std::string checkpoint_folder(const std::string& root, int64_t step) {
  std::ostringstream name;
  name << "step_" << std::setw(8) << std::setfill('0') << step;
  return (fs::path(root) / name.str()).string();
}

CheckpointStore::CheckpointStore(std::string root, dist::GroupPtr world, int keep)
    : root_(std::move(root)), world_(std::move(world)), keep_(keep) {}

void CheckpointStore::save(int64_t step, const io::NamedTensors& weights, const optim::Optimizer& optimizer,
                           const nlohmann::json& trainer_state) const {
  save(step, weights, optimizer.state_tensors(), optimizer.name(), trainer_state);
}

void CheckpointStore::save(int64_t step, const io::NamedTensors& weights, const io::NamedTensors& optimizer_state,
                           const std::string& optimizer_name, const nlohmann::json& trainer_state) const {
  save(step, {CheckpointPart{"", weights, optimizer_state, optimizer_name}}, trainer_state);
}

namespace {

// The random generators a resumed run continues: the CPU's and, on a GPU, that GPU's (dropout masks).
io::NamedTensors generator_states() {
  io::NamedTensors generators = {{"cpu", generator_state(torch::kCPU)}};
  if (const auto gpu = current_cuda_device()) generators.emplace_back("cuda", generator_state(*gpu));
  return generators;
}

}  // namespace

struct CheckpointStore::PendingSave {
  int64_t step = 0;
  std::string partial;
  std::vector<CheckpointPart> parts;  // host copies
  nlohmann::json trainer_state;
  io::NamedTensors rank_state, generators;
  std::thread writer;
  std::atomic<bool> ended{false};
  std::exception_ptr error;  // what the writer threw
};

void CheckpointStore::save(int64_t step, const std::vector<CheckpointPart>& parts, const nlohmann::json& trainer_state,
                           const io::NamedTensors& rank_state) const {
  KUAFU_CHECK(!pending_, "a synchronous save while the asynchronous save of step ", pending_ ? pending_->step : 0,
              " is not finished");
  const std::string partial = begin_save(step);
  write_rank_files(step, partial, parts, trainer_state, rank_state, generator_states());
  seal(step);
}

std::string CheckpointStore::begin_save(int64_t step) const {
  const std::string partial = checkpoint_folder(root_, step) + kPartialSuffix;
  if (world_->rank() == 0) {
    fs::create_directories(root_);
    fs::remove_all(partial);  // left by a run that died while saving
    fs::create_directories(partial);
  }
  dist::barrier(*world_);
  return partial;
}

void CheckpointStore::write_rank_files(int64_t step, const std::string& partial, const std::vector<CheckpointPart>& parts,
                                       const nlohmann::json& trainer_state, const io::NamedTensors& rank_state,
                                       const io::NamedTensors& generators) const {
  const int rank = world_->rank();
  const bool main = rank == 0;
  std::map<std::string, FileSum> sums;  // what this rank writes, for the manifest
  const auto in_partial = [&](const std::string& name) { return (fs::path(partial) / name).string(); };
  sums[rng_file(rank)] = io::save_safetensors(in_partial(rng_file(rank)), generators);
  if (!rank_state.empty()) sums[task_state_file(rank)] = io::save_safetensors(in_partial(task_state_file(rank)), rank_state);
  std::set<std::string> names;
  for (const CheckpointPart& part : parts) {
    KUAFU_CHECK(names.insert(part.name).second && (part.name.empty() || plain_file_name(part.name)),
                "checkpoint parts need distinct names usable in file names; found \"", part.name, "\" twice or unusable");
    const std::map<std::string, std::string> model_meta = {{"format", "pt"}};
    const std::map<std::string, std::string> optimizer_meta = {{"optimizer", part.optimizer_name}};
    const auto write = [&](const char* kind, const auto& tensors, const std::map<std::string, std::string>& meta) {
      sums[whole_file_name(part.name, kind)] =
          io::save_safetensors(in_partial(whole_file_name(part.name, kind)), tensors, meta, part.before_write);
    };
    // The part's memory on demand is let go however its writing ends.
    struct AfterWrite {
      const std::function<void()>& done;
      ~AfterWrite() {
        try {
          if (done) done();
        } catch (const std::exception& e) {  // it only lets memory go: the save's own error, if any, goes on
          log::warnf("after writing a checkpoint part: ", e.what());
        }
      }
    } after_write{part.after_write};
    KUAFU_CHECK(!part.before_write || part.sharded, "a checkpoint part with memory on demand must be sharded");
    if (!part.sharded) {
      if (!main) continue;
      write(kModel, part.weights, model_meta);
      if (!part.optimizer_name.empty()) write(kOptimizer, part.optimizer_state, optimizer_meta);
      continue;
    }
    const auto all_whole = [](const std::vector<TensorPiece>& pieces) {
      return std::all_of(pieces.begin(), pieces.end(), [](const TensorPiece& p) { return is_whole(p.place, p.data.numel()); });
    };
    if (world_->size() == 1 && all_whole(part.weight_pieces) && all_whole(part.state_pieces)) {
      // One process holds every piece whole: the plain files, as a run on one rank always wrote.
      const auto as_tensors = [](const std::vector<TensorPiece>& pieces) {
        io::NamedTensors tensors;
        for (const TensorPiece& p : pieces) tensors.emplace_back(p.name, p.data.view(p.place.shape));
        return tensors;
      };
      write(kModel, as_tensors(part.weight_pieces), model_meta);
      if (!part.optimizer_name.empty()) write(kOptimizer, as_tensors(part.state_pieces), optimizer_meta);
      continue;
    }
    const auto write_pieces = [&](const char* kind, const std::vector<TensorPiece>& pieces,
                                  const std::map<std::string, std::string>& meta) {
      const std::string file = shard_file_name(part.name, kind, rank);
      sums[file] = save_pieces(in_partial(file), pieces, meta, part.before_write);
    };
    write_pieces(kModel, part.weight_pieces, model_meta);
    if (!part.optimizer_name.empty()) write_pieces(kOptimizer, part.state_pieces, optimizer_meta);
  }
  if (main) {
    nlohmann::json state = trainer_state;
    state["step"] = step;
    state["world_size"] = world_->size();
    const std::string text = state.dump(2);
    sums[kTrainer] = write_file_atomic_streamed(in_partial(kTrainer), [&](const ByteSink& write) {
      write(text.data(), text.size());
    });
  }
  nlohmann::json mine = nlohmann::json::object();
  for (const auto& [file, sum] : sums) mine[file] = {{"bytes", sum.bytes}, {"crc32", sum.crc32}};
  write_file_atomic(in_partial(sums_file(rank)), mine.dump());
}

void CheckpointStore::seal(int64_t step) const {
  const std::string final_folder = checkpoint_folder(root_, step);
  const std::string partial = final_folder + kPartialSuffix;
  const auto in_partial = [&](const std::string& name) { return (fs::path(partial) / name).string(); };
  dist::barrier(*world_);
  if (world_->rank() == 0) {
    // Every rank's files, summed as they were written (no file is read back).
    nlohmann::json manifest;
    manifest["files"] = nlohmann::json::object();
    for (int r = 0; r < world_->size(); ++r) {
      manifest["files"].update(nlohmann::json::parse(read_file(in_partial(sums_file(r)))));
      fs::remove(in_partial(sums_file(r)));
    }
    manifest["step"] = step;
    write_file_atomic(in_partial(kManifest), manifest.dump(2));
    fsync_path(partial);
    if (fs::exists(final_folder)) fs::remove_all(final_folder);  // only ever a re-save of this same step
    rename_durable(partial, final_folder);
    write_file_atomic((fs::path(root_) / "latest").string(), fs::path(final_folder).filename().string() + "\n");
    prune(step);
  }
  dist::barrier(*world_);
}

namespace {

// `t`'s values in host memory, owned by the copy: the snapshot an asynchronous save writes while
// training changes the originals.
torch::Tensor host_copy(const torch::Tensor& t) { return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true); }

io::NamedTensors host_copies(const io::NamedTensors& tensors) {
  io::NamedTensors out;
  for (const auto& [name, t] : tensors) out.emplace_back(name, host_copy(t));
  return out;
}

std::vector<TensorPiece> host_copies(const std::vector<TensorPiece>& pieces) {
  std::vector<TensorPiece> out = pieces;
  for (TensorPiece& p : out) p.data = host_copy(p.data);
  return out;
}

}  // namespace

bool on_any_rank(bool mine, const dist::ProcessGroup& world) {
  if (world.size() == 1) return mine;
  torch::Tensor flag = torch::tensor({mine ? 1.0 : 0.0}, torch::TensorOptions(torch::kFloat64).device(world.device()));
  dist::all_reduce(flag, world, dist::Reduce::kMax);
  return flag.item<double>() > 0;
}

void CheckpointStore::save_async(int64_t step, const std::vector<CheckpointPart>& parts,
                                 const nlohmann::json& trainer_state, const io::NamedTensors& rank_state) {
  finish_pending();
  auto pending = std::make_unique<PendingSave>();
  pending->step = step;
  pending->partial = begin_save(step);
  for (const CheckpointPart& part : parts) {
    KUAFU_CHECK(!part.before_write, "an asynchronous save cannot snapshot a part whose memory comes on demand "
                                    "(master chunks on Gemini's disk tier): save synchronously");
    CheckpointPart copy = part;
    copy.weights = host_copies(part.weights);
    copy.optimizer_state = host_copies(part.optimizer_state);
    copy.weight_pieces = host_copies(part.weight_pieces);
    copy.state_pieces = host_copies(part.state_pieces);
    pending->parts.push_back(std::move(copy));
  }
  pending->trainer_state = trainer_state;
  pending->rank_state = host_copies(rank_state);
  pending->generators = generator_states();  // now, not when the writer gets to them
  PendingSave* p = pending.get();
  pending->writer = std::thread([this, p] {
    try {
      write_rank_files(p->step, p->partial, p->parts, p->trainer_state, p->rank_state, p->generators);
    } catch (...) {
      p->error = std::current_exception();
    }
    p->ended.store(true, std::memory_order_release);
  });
  pending_ = std::move(pending);
}

bool CheckpointStore::writing() const { return pending_ && !pending_->ended.load(std::memory_order_acquire); }

void CheckpointStore::finish_pending() {
  if (!pending_) return;
  const std::unique_ptr<PendingSave> pending = std::move(pending_);
  pending->writer.join();
  // Every rank learns whether a writer failed, so that all stop together instead of waiting in the
  // seal's barrier for the one that failed.
  const bool failed_elsewhere = on_any_rank(static_cast<bool>(pending->error), *world_);
  if (pending->error) std::rethrow_exception(pending->error);
  if (failed_elsewhere) {
    throw Error(detail::concat("checkpoint ", pending->partial, ": another rank could not write its part (its log "
                               "names the file); ", (fs::path(root_) / "latest").string(), " still names the previous checkpoint"));
  }
  seal(pending->step);
}

CheckpointStore::~CheckpointStore() {
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

void CheckpointStore::prune(int64_t saved) const {
  // Only older steps go: the one just saved stays, and so do higher steps (left by the run this one
  // resumed from an earlier checkpoint of), which are another history, not older than this one.
  std::vector<fs::path> older;
  for (const auto& [step, folder] : step_folders(root_)) {
    if (step < saved) older.push_back(folder);
  }
  const size_t keep_older = static_cast<size_t>(keep_ - 1);
  for (size_t i = 0; i + keep_older < older.size(); ++i) fs::remove_all(older[i]);
}

std::optional<std::pair<std::string, nlohmann::json>> CheckpointStore::latest_intact() const {
  const std::optional<std::string> newest = latest();
  if (!newest) return std::nullopt;
  try {
    return std::make_pair(*newest, read_trainer_state(*newest, world_.get()));
  } catch (const Error& damaged) {
    const std::optional<int64_t> newest_step = step_of_name(fs::path(*newest).filename().string());
    const auto folders = step_folders(root_);
    for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
      if (!newest_step || it->first >= *newest_step) continue;
      nlohmann::json state;
      try {
        state = read_trainer_state(it->second.string(), world_.get());
      } catch (const Error&) {
        continue;
      }
      log::warnf("the newest checkpoint is damaged (", damaged.what(), "): resuming from the newest intact one, ",
                 it->second.string());
      return std::make_pair(it->second.string(), state);
    }
    throw;
  }
}

void CheckpointStore::remove_unfinished_saves() const {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(root_, error)) {
    const std::string name = entry.path().filename().string();
    const size_t stem = name.size() - std::min(name.size(), std::string(kPartialSuffix).size());
    if (name.substr(stem) != kPartialSuffix || !step_of_name(name.substr(0, stem))) continue;
    fs::remove_all(entry.path(), error);
    log::warnf("removed ", entry.path().string(), ", left by a checkpoint save that did not finish");
  }
}

std::vector<std::string> CheckpointStore::later_than(int64_t step) const {
  std::vector<std::string> later;
  for (const auto& [s, folder] : step_folders(root_)) {
    if (s > step) later.push_back(folder.filename().string());
  }
  return later;
}

std::optional<std::string> CheckpointStore::latest() const {
  const fs::path pointer = fs::path(root_) / "latest";
  const auto status = fs::symlink_status(pointer);
  if (fs::exists(status)) {
    // The pointer is a small file naming a folder beside it; it is never followed elsewhere, and what
    // it holds is not echoed unless it is such a name.
    KUAFU_CHECK(fs::is_regular_file(status), pointer.string(),
                " is not a regular file (a link or a folder); it must hold a step_N name. Refusing to follow it");
    const auto bytes = fs::file_size(pointer);
    KUAFU_CHECK(bytes <= 64, pointer.string(), " holds ", bytes, " bytes; it must hold a step_N name");
    std::string name = read_file(pointer.string());
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
    KUAFU_CHECK(step_of_name(name), pointer.string(), " does not hold a step_N name of a folder beside it");
    const fs::path folder = fs::path(root_) / name;
    const auto folder_status = fs::symlink_status(folder);
    if (fs::is_directory(folder_status)) return folder.string();
    // A folder that is gone (a save of the same step died between removing the old one and renaming
    // the new one in) is passed over like a missing pointer; anything else there is refused.
    KUAFU_CHECK(!fs::exists(folder_status), pointer.string(), " names ", name, ", which is not a folder in ", root_);
  }
  // No pointer (deleted, or lost before it was written), or one naming a folder that is gone: the newest
  // complete checkpoint, so that a run never starts over checkpoints that are there.
  const auto folders = step_folders(root_);
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
    if (fs::is_regular_file(it->second / kManifest)) {
      log::warnf(pointer.string(), fs::exists(status) ? " names a folder that is gone" : " is missing",
                 ": taking the newest complete checkpoint, ", it->second.string());
      return it->second.string();
    }
  }
  KUAFU_CHECK(folders.empty(), root_, " holds ", folders.size(), " step_N folder(s) but no complete checkpoint and no "
              "latest pointer; refusing to start over them. Move them away or name one in train.resume");
  return std::nullopt;
}

io::NamedTensors CheckpointStore::read_whole(const std::string& folder, const std::string& kind, const std::string& part) {
  const SavedTensors saved(folder, part, kind);
  io::NamedTensors tensors;
  for (const std::string& name : saved.names()) tensors.emplace_back(name, saved.read(name));
  return tensors;
}

io::NamedTensors CheckpointStore::load_task_state(const std::string& folder, int rank) {
  const fs::path path = fs::path(folder) / task_state_file(rank);
  if (!fs::exists(path)) return {};
  return io::load_safetensors(path.string()).tensors;
}

nlohmann::json CheckpointStore::read_trainer_state(const std::string& folder, const dist::ProcessGroup* share) {
  const nlohmann::json manifest = verified_manifest(folder, share);
  const std::string path = (fs::path(folder) / kTrainer).string();
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint " + folder + ": trainer.json is corrupt: " + e.what());
  }
  // The step decides the learning rate and the data drawn: it must be a count the run could have made,
  // and the same in every record of the checkpoint.
  KUAFU_CHECK(state.is_object() && state.contains("step") && state.at("step").is_number_integer() &&
                  state.at("step").get<int64_t>() >= 0,
              path, ": \"step\" must be a whole number >= 0 (the optimizer steps taken)");
  const int64_t step = state.at("step").get<int64_t>();
  if (state.contains("fingerprint") && !state.at("fingerprint").is_null()) {
    const nlohmann::json& fingerprint = state.at("fingerprint");
    KUAFU_CHECK(fingerprint.is_object(), path, ": \"fingerprint\" must be a table of setting texts (key = \"value\"), ",
                "found ", text::abbreviate(fingerprint.dump()));
    for (const auto& [key, value] : fingerprint.items()) {
      KUAFU_CHECK(value.is_string(), path, ": \"fingerprint\" must be a table of setting texts, but \"",
                  text::abbreviate(key), "\" is ", text::abbreviate(value.dump()));
    }
  }
  const auto named = step_of_name(fs::path(folder).filename().string());
  KUAFU_CHECK(!named || *named == step, path, " says step ", step, " but the folder is ",
              fs::path(folder).filename().string());
  const std::string manifest_path = (fs::path(folder) / kManifest).string();
  if (manifest.contains("step")) {
    const nlohmann::json& saved = manifest.at("step");
    KUAFU_CHECK(saved.is_number_integer(), manifest_path, ": \"step\" must be a whole number, found ",
                text::abbreviate(saved.dump()));
    KUAFU_CHECK(saved.get<int64_t>() == step, path, " says step ", step, " but ", kManifest, " says ", saved.dump());
  }
  return state;
}

void CheckpointStore::load_model(const std::string& folder, torch::nn::Module& model, const std::string& part) {
  load_weights(folder, named_weights(model), nullptr, part);
}

void CheckpointStore::load_weights(const std::string& folder, const io::NamedTensors& weights,
                                   const PlaceOf& place_of, const std::string& part, bool subset,
                                   const std::function<void(const std::string&)>& before_store) {
  verified_manifest(folder);
  restore_weights(folder, weights, place_of, subset, part, nullptr, before_store);
}

nlohmann::json CheckpointStore::load(const std::string& folder, const io::NamedTensors& weights,
                                     optim::Optimizer& optimizer, const LoadTarget& target, const std::string& part) {
  nlohmann::json state = read_trainer_state(folder);
  const uint64_t read_before = io::tensor_bytes_read();
  restore_weights(folder, weights, target.weight_place, target.part, part, target.store);
  const SavedTensors saved_state(folder, part, kOptimizer);
  const std::string& optimizer_path = saved_state.where();
  std::set<std::string> held;  // a pipeline stage's parameters: the state of the others is not read
  for (const auto& item : weights) held.insert(item.first);
  optim::Optimizer::SavedState optimizer_state;
  optimizer_state.metadata = saved_state.metadata();
  for (const std::string& name : saved_state.names()) {
    const auto owner = optim::state_owner(name);
    optimizer_state.count += !(owner && target.part && !held.count(*owner));
  }
  // One saved tensor at a time, read when the optimizer asks for it and cut to this rank's layout.
  optimizer_state.read = [&](const std::string& name) -> std::optional<torch::Tensor> {
    if (!saved_state.contains(name)) return std::nullopt;
    // A parameter's state takes its parameter's layout; other state (the step counter) is whole.
    const auto owner = optim::state_owner(name);
    if (!owner) return saved_state.read(name);
    const PlaceOf& place_of = target.state_place ? target.state_place : target.weight_place;
    if (target.before_state) target.before_state(*owner);
    return part_of(saved_state, name, place_of ? place_of(*owner) : std::nullopt);
  };
  const std::optional<torch::Tensor> optimizer_steps = optimizer_state.read("step");
  // The optimizer steps once per training step except those skipped for overflow (fp16).
  const int64_t step = state.at("step").get<int64_t>();
  KUAFU_CHECK(optimizer_steps && optimizer_steps->numel() == 1, optimizer_path, ": lacks the 'step' counter");
  const int64_t taken = optimizer_steps->to(torch::kInt64).item<int64_t>();
  KUAFU_CHECK(taken >= 0 && taken <= step, optimizer_path, ": the optimizer took ", taken, " steps, which does not fit ",
              "step ", step, " of trainer.json");
  optimizer.load_state_tensors(optimizer_state, optimizer_path, target.part);
  log::infof(folder, part.empty() ? std::string() : " (model \"" + part + "\")", ": read ",
             (io::tensor_bytes_read() - read_before) >> 20, " MiB of weights and optimizer state (this rank's part)");
  const fs::path rng_path = fs::path(folder) / rng_file(target.rank);
  if (!fs::exists(rng_path)) {
    const nlohmann::json world_size = state.value("world_size", nlohmann::json(0));
    KUAFU_CHECK(world_size.is_number_integer(), (fs::path(folder) / kTrainer).string(),
                ": \"world_size\" must be a whole number, found ", text::abbreviate(world_size.dump()));
    log::warnf("checkpoint ", folder, " was written by ", world_size.dump(), " ranks and has no RNG state for rank ",
               target.rank, ": random streams (dropout) restart");
    return state;
  }
  io::SafetensorsFile rng = io::load_safetensors(rng_path.string());
  KUAFU_CHECK(rng.find("cpu"), rng_path.string(), " lacks the 'cpu' generator state");
  set_generator_state(torch::kCPU, *rng.find("cpu"));
  const auto gpu = current_cuda_device();
  if (const torch::Tensor* cuda = rng.find("cuda"); cuda && gpu) {
    set_generator_state(*gpu, *cuda);
  } else if (gpu) {
    log::warnf("checkpoint ", folder, " holds no GPU generator state (written on a CPU): dropout on the GPU draws anew");
  }
  return state;
}

}  // namespace kuafu::train

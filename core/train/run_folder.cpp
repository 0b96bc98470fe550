#include "core/train/run_folder.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/dist/collectives.h"
#include "core/util/atomic_file.h"
#include "core/util/logging.h"

namespace kuafu::train {
namespace fs = std::filesystem;

namespace {

std::string value_text(const config::Config& config, const std::string& key) {
  switch (config.schema().find(key)->type()) {
    case config::Type::kInt: return config::to_toml_value(config.get_int(key));
    case config::Type::kFloat: return config::to_toml_value(config.get_float(key));
    case config::Type::kBool: return config::to_toml_value(config.get_bool(key));
    case config::Type::kString: return config::to_toml_value(config.get_string(key));
    case config::Type::kIntList: return config::to_toml_value(config.get_int_list(key));
    case config::Type::kFloatList: return config::to_toml_value(config.get_float_list(key));
    case config::Type::kStringList: return config::to_toml_value(config.get_string_list(key));
  }
  return "";
}

}  // namespace

RunFolder::RunFolder(const config::Config& config, const Runtime& runtime, const TrainSettings& settings,
                     std::vector<std::string> fingerprint)
    : config_(config), runtime_(runtime), fingerprint_prefixes_(std::move(fingerprint)), out_dir_(settings.out_dir),
      resume_(settings.resume), async_save_(settings.async_save) {
  // One run per out_dir: the main rank holds the folder's lock for the run's life, and every rank
  // stops when another run holds it (before anything is written).
  std::string refused;
  if (runtime.is_main()) {
    try {
      lock_ = std::make_unique<FolderLock>(out_dir_, "train.out_dir");
    } catch (const Error& e) {
      refused = e.what();
    }
  }
  if (on_any_rank(!refused.empty(), *runtime.world->world_group())) {
    throw Error(refused.empty() ? "train.out_dir = " + out_dir_ + " is in use by another run (see rank 0)" : refused);
  }
  checkpoints_ = std::make_unique<CheckpointStore>((fs::path(out_dir_) / "checkpoints").string(),
                                                   runtime.world->world_group(),
                                                   static_cast<int>(settings.keep_checkpoints));
  // The effective config of the latest invocation beside metrics.jsonl, for reports (each checkpoint
  // keeps its own copy in trainer.json).
  if (runtime.is_main()) {
    write_file_atomic((fs::path(out_dir_) / "config.toml").string(), config_.to_toml());
    checkpoints_->remove_unfinished_saves();
  }
}

namespace {

// Settings every run's checkpoint records besides its task's keys: what they change of the run (a
// resume refuses a change), or where a change is harmless, only warns of it.
const std::vector<std::string> kRefusedChanges = {"optim.no_decay"};  // which parameters decay: the optimizer state's meaning
const std::vector<std::string> kWarnedChanges = {"train.steps"};      // the schedule's length: the rate from here on

bool among(const std::string& key, const std::vector<std::string>& keys) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

}  // namespace

nlohmann::json RunFolder::fingerprint() const {
  nlohmann::json fingerprint = nlohmann::json::object();
  for (const auto& prefix : fingerprint_prefixes_) {
    for (const auto& key : config_.schema().keys()) {
      if (key.rfind(prefix, 0) == 0) fingerprint[key] = value_text(config_, key);
    }
  }
  for (const auto* keys : {&kRefusedChanges, &kWarnedChanges}) {
    for (const std::string& key : *keys) {
      if (config_.schema().find(key)) fingerprint[key] = value_text(config_, key);
    }
  }
  return fingerprint;
}

std::optional<Resume> RunFolder::checkpoint_to_resume() const {
  const std::string& resume = resume_;
  std::optional<Resume> found;
  if (resume == "auto") {
    if (auto intact = checkpoints_->latest_intact()) found = Resume{intact->first, std::move(intact->second)};
  } else if (resume == "never") {
    if (const std::optional<std::string> latest = checkpoints_->latest()) {
      config_.fail_at("train.resume", "is \"never\" but " + out_dir_ + " already holds checkpoints (latest " + *latest +
                                          "); choose another train.out_dir or resume");
    }
  } else {
    found = Resume{resume, CheckpointStore::read_trainer_state(resume, runtime_.world->world_group().get())};
  }
  if (!found) {
    if (runtime_.is_main() && fs::exists(fs::path(out_dir_) / "metrics.jsonl")) trim_metrics_after(0);
    return std::nullopt;
  }
  const std::string& folder = found->folder;
  // read_trainer_state checked its type; a state without one fails below at the first key.
  const nlohmann::json trained = found->trainer_state.value("fingerprint", nlohmann::json::object());
  const nlohmann::json expected = fingerprint();  // items() refers to it: it must outlive the loop
  for (const auto& [key, value] : expected.items()) {
    const auto saved = trained.find(key);
    const bool recorded_since = among(key, kRefusedChanges) || among(key, kWarnedChanges);
    if (saved == trained.end() && recorded_since) continue;  // a checkpoint from before they were recorded
    if (saved != trained.end() && *saved != value && among(key, kWarnedChanges)) {
      if (runtime_.is_main()) {
        log::warnf(key, " is ", value.get<std::string>(), " but checkpoint ", folder, " was trained with ",
                   saved->get<std::string>(), ": the run goes on, its learning-rate schedule now spread over the new length");
      }
      continue;
    }
    if (saved == trained.end() || *saved != value) {
      config_.fail_at(key, "is " + value.get<std::string>() + " but checkpoint " + folder + " was trained with " +
                               (saved == trained.end() ? std::string("no such key") : saved->get<std::string>()) +
                               "; use the same model settings or another train.out_dir");
    }
  }
  return found;
}

void RunFolder::resumed(const Resume& resume) const {
  if (!runtime_.is_main()) return;
  trim_metrics_after(resume.step());
  log::infof("resumed from ", resume.folder, " at step ", resume.step());
  const auto later = checkpoints_->later_than(resume.step());
  if (!later.empty()) {
    log::warnf(checkpoints_->root(), " also holds ", later.size(), " later checkpoint(s) (", later.front(),
               later.size() > 1 ? " ... " + later.back() : std::string(), "): kept, and replaced only when this "
               "run saves the same step");
  }
}

void RunFolder::trim_metrics_after(int64_t step) const {
  // A resumed run repeats the steps after its checkpoint; drop their old lines so the file stays one curve.
  const std::string path = (fs::path(out_dir_) / "metrics.jsonl").string();
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t{0}) <= step) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      // A torn last line from a killed run: drop it.
    }
  }
  write_file_atomic(path, kept);
}

void RunFolder::write_metrics(const nlohmann::json& line) const {
  if (!runtime_.is_main()) return;
  fs::create_directories(out_dir_);
  std::ofstream out(fs::path(out_dir_) / "metrics.jsonl", std::ios::app);
  out << line.dump() << "\n";
}

void RunFolder::save(int64_t step, const std::vector<CheckpointPart>& parts, nlohmann::json trainer_state,
                     const io::NamedTensors& rank_state) const {
  trainer_state["fingerprint"] = fingerprint();
  trainer_state["config"] = config_.to_toml();
  if (!async_save_) {
    checkpoints_->save(step, parts, trainer_state, rank_state);
    if (runtime_.is_main()) log::infof("saved checkpoint ", checkpoint_folder(checkpoints_->root(), step));
    return;
  }
  finish_checkpoint();  // the previous one first
  checkpoints_->save_async(step, parts, trainer_state, rank_state);
  if (runtime_.is_main()) log::infof("saving checkpoint ", checkpoint_folder(checkpoints_->root(), step), " in the background");
}

void RunFolder::finish_checkpoint() const {
  if (!checkpoints_->pending()) return;
  checkpoints_->finish_pending();
  if (runtime_.is_main()) log::infof("saved checkpoint ", *checkpoints_->latest());
}

}  // namespace kuafu::train

// TOML configs (core/config): a config file's text, then optionally a line "#--set" and --set overrides,
// one a line, loaded against a schema with every kind of key the apps declare (bounds, choices, lists,
// per-model sections). A config that loads must also write itself out (to_toml) and read back equal.
#include <cstdlib>
#include <vector>

#include "core/config/config.h"
#include "fuzz/fuzz_support.h"

namespace {

using kuafu::config::Config;
using kuafu::config::Schema;

Schema make_schema() {
  Schema s;
  s.add_int("model.n_layer", 2, "layers").min(1).max(1024);
  s.add_int("model.n_head", 2, "heads").min(1);
  s.add_int("model.n_embd", 64, "width").min(1);
  s.add_int("model.n_positions", 64, "positions").min(1);
  s.add_int("data.vocab_size", 0, "vocabulary").min(0);
  s.add_int("data.context", 64, "context").min(1);
  s.add_int("train.batch_size", 16, "batch").min(1);
  s.add_int("train.micro_batch_size", 0, "micro-batch").min(0);
  s.add_int("train.eval_rows", 0, "evaluation rows").min(0);
  s.add_int("optim.warmup_steps", 0, "warm-up").min(0);
  s.add_float("model.dropout", 0.1, "dropout").min(0).max(0.9);
  s.add_int("train.steps", 50, "steps").min(0);
  s.add_bool("train.resume_latest", false, "resume");
  s.add_string("train.out_dir", "runs/tiny", "output folder");
  s.add_string("precision.dtype", "fp32", "dtype").choices({"fp32", "bf16", "fp16", "fp64"});
  s.add_float("optim.lr", 3e-4, "learning rate").min(0);
  s.add_float_list("optim.betas", {0.9, 0.999}, "Adam betas").min(0).max(1);
  s.add_int_list("parallel.stages", {}, "stage sizes").min(1);
  s.add_string_list("lora.targets", {"q_proj", "v_proj"}, "adapted layers");
  s.add_model_sections({"policy", "critic"}, {"optim", "precision"});
  return s;
}

std::vector<std::string> lines_of(std::string_view text) {
  std::vector<std::string> lines;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    lines.emplace_back(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
  }
  return lines;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Schema schema = make_schema();
  const auto [toml, sets] = kuafu::fuzz::split_at(kuafu::fuzz::as_text(data, size), "\n#--set\n");
  kuafu::fuzz::expect_named_errors([&, toml = toml, sets = sets] {
    const Config config = Config::from_string(std::string(toml), "fuzz.toml", schema, lines_of(sets));
    for (const char* model : {"policy", "critic"}) config.model_view(model);
    // What to_toml writes must read back to the same config: a failure here escapes as a bug.
    const std::string written = config.to_toml();
    try {
      if (Config::from_string(written, "written.toml", schema) != config) std::abort();
    } catch (const kuafu::Error&) {
      std::abort();
    }
  });
  return 0;
}

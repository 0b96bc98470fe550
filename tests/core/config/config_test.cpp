// Tests of the config layer: schema declaration, TOML loading and validation messages, --set overrides,
// defaults and sources, printing the effective config; plus the small text helpers it uses.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "core/config/config.h"
#include "core/config/schema.h"
#include "core/util/error.h"
#include "core/util/text.h"
#include "tests/support/test_util.h"

namespace kuafu::config {
namespace {

Schema test_schema() {
  Schema s;
  s.add_int("seed", 1234, "random seed");
  s.add_int("train.steps", 1000, "number of optimizer steps").min(1);
  s.add_bool("train.compile", false, "compile the model");
  s.add_float("optim.lr", 3e-4, "peak learning rate").min(0).max(10);
  s.add_float_list("optim.betas", {0.9, 0.95}, "Adam betas").min(0).max(1);
  s.add_float("rl.penalty", -1, "a float without bounds");
  s.add_float_list("rl.weights", {1.0}, "floats without bounds");
  s.add_string("precision", "fp32", "compute precision").choices({"fp32", "bf16", "fp16"});
  s.add_string("run.name", "run", "name of the run");
  s.add_string_list("data.files", {}, "token files");
  s.add_int_list("model.layers_per_stage", {2, 2}, "layers of each pipeline stage").min(1);
  s.add_int("parallel.data", 1, "data-parallel size").min(1);
  s.add_int("parallel.tensor.size", 1, "tensor-parallel size").min(1);
  return s;
}

Config parse(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  return Config::from_string(toml, "test.toml", test_schema(), overrides);
}

using testing::Contains;
std::string error_of(const std::function<void()>& action) { return testing::expected_error(action); }

std::string load_error(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse(toml, overrides); });
}

TEST(ConfigTest, DefaultsFillMissingKeys) {
  const Config c = parse("");
  EXPECT_EQ(c.get_int("train.steps"), 1000);
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 3e-4);
  EXPECT_FALSE(c.get_bool("train.compile"));
  EXPECT_EQ(c.get_string("precision"), "fp32");
  EXPECT_EQ(c.get_int_list("model.layers_per_stage"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(c.get_float_list("optim.betas"), (std::vector<double>{0.9, 0.95}));
  EXPECT_TRUE(c.get_string_list("data.files").empty());
  EXPECT_FALSE(c.is_set("train.steps"));
  EXPECT_EQ(c.source_of("train.steps"), "default");
  EXPECT_EQ(c.path(), "test.toml");
}

TEST(ConfigTest, ReadsSectionsInlineTablesAndDottedKeys) {
  const Config c = parse(
      "seed = 7\n"
      "model.layers_per_stage = [4, 3]\n"
      "parallel = { data = 2, tensor.size = 4 }\n"
      "[train]\n"
      "steps = 10\n"
      "compile = true\n"
      "[optim]\n"
      "lr = 1  # an integer is fine for a float\n"
      "betas = [0.8, 1]\n"
      "[data]\n"
      "files = [\"a.bin\", \"b.bin\"]\n");
  EXPECT_EQ(c.get_int("seed"), 7);
  EXPECT_EQ(c.get_int_list("model.layers_per_stage"), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(c.get_int("parallel.data"), 2);
  EXPECT_EQ(c.get_int("parallel.tensor.size"), 4);
  EXPECT_EQ(c.get_int("train.steps"), 10);
  EXPECT_TRUE(c.get_bool("train.compile"));
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 1.0);
  EXPECT_EQ(c.get_float_list("optim.betas"), (std::vector<double>{0.8, 1.0}));
  EXPECT_EQ(c.get_string_list("data.files"), (std::vector<std::string>{"a.bin", "b.bin"}));
}

TEST(ConfigTest, IsSetAndSourceOf) {
  const Config c = parse("[train]\nsteps = 10\ncompile = true\n", {"train.compile=false"});
  EXPECT_TRUE(c.is_set("train.steps"));
  EXPECT_EQ(c.source_of("train.steps"), "test.toml:2");
  EXPECT_TRUE(c.is_set("train.compile"));
  EXPECT_EQ(c.source_of("train.compile"), "--set");
  EXPECT_FALSE(c.is_set("optim.lr"));
  EXPECT_EQ(c.source_of("optim.lr"), "default");
}

TEST(ConfigTest, UnknownKeyNamesPlaceAndSuggests) {
  const std::string message = load_error("seed = 1\n[train]\nstepz = 5\n");
  EXPECT_TRUE(Contains(message, "unknown key 'train.stepz' at test.toml:3:1"));
  EXPECT_TRUE(Contains(message, "did you mean 'train.steps'?"));
  // A key put in the wrong section is found by its last component.
  EXPECT_TRUE(
      Contains(load_error("lr = 0.1\n"), "unknown key 'lr' at test.toml:1:1; did you mean 'optim.lr'?"));
  // Nothing close: no suggestion.
  EXPECT_FALSE(Contains(load_error("[train]\nwhatever_this_is = 1\n"), "did you mean"));
  EXPECT_TRUE(
      Contains(load_error("[trian]\n"), "unknown section 'trian' at test.toml:1:2; did you mean 'train'?"));
}

TEST(ConfigTest, WrongTypeNamesExpectationAndFinding) {
  EXPECT_TRUE(Contains(load_error("[train]\nsteps = \"ten\"\n"),
                       "key 'train.steps' at test.toml:2:9: expected an integer, found string \"ten\""));
  EXPECT_TRUE(Contains(load_error("[train]\nsteps = 2.5\n"), "expected an integer, found float 2.5"));
  EXPECT_TRUE(Contains(load_error("[train]\ncompile = 1\n"), "expected a boolean, found integer 1"));
  EXPECT_TRUE(Contains(
      load_error("[optim]\nbetas = [0.9, \"x\"]\n"),
      "key 'optim.betas' at test.toml:2:9: expected a list of floats, found string \"x\" at index 1"));
  EXPECT_TRUE(Contains(load_error("[optim]\nlr = [1]\n"), "expected a float, found array"));
  EXPECT_TRUE(Contains(load_error("train = 5\n"),
                       "key 'train' at test.toml:1:9: expected a section of keys such as 'train.compile'"));
}

TEST(ConfigTest, OutOfRange) {
  EXPECT_TRUE(Contains(load_error("[train]\nsteps = 0\n"),
                       "key 'train.steps' at test.toml:2:9: expected >= 1, found 0"));
  EXPECT_TRUE(Contains(load_error("[optim]\nlr = 11.5\n"),
                       "key 'optim.lr' at test.toml:2:6: expected <= 10, found 11.5"));
  EXPECT_TRUE(Contains(load_error("model.layers_per_stage = [2, 0]\n"),
                       "expected elements >= 1, found 0 at index 1"));
}

// nan and inf are TOML floats; a key without bounds refuses them too, where the file or --set says them.
TEST(ConfigTest, NonFiniteNumbersAreRefusedWhereverTheyAreWritten) {
  EXPECT_TRUE(Contains(load_error("[rl]\npenalty = nan\n"), "key 'rl.penalty' at test.toml:2:11: expected a finite number, found nan"));
  EXPECT_TRUE(Contains(load_error("[rl]\npenalty = -inf\n"), "expected a finite number, found -inf"));
  EXPECT_TRUE(Contains(load_error("[rl]\nweights = [1.0, inf]\n"), "expected finite elements, found inf at index 1"));
  EXPECT_TRUE(Contains(load_error("", {"rl.penalty=+nan"}), "--set rl.penalty=+nan: expected a finite number, found nan"));
  EXPECT_TRUE(Contains(load_error("[optim]\nlr = nan\n"), "key 'optim.lr' at test.toml:2:6: expected a finite number, found nan"));
  EXPECT_DOUBLE_EQ(parse("[rl]\npenalty = -1e300\n").get_float("rl.penalty"), -1e300);
}

TEST(ConfigTest, BadChoiceListsTheChoices) {
  EXPECT_TRUE(Contains(
      load_error("precision = \"fp8\"\n"),
      "key 'precision' at test.toml:1:13: expected one of \"fp32\", \"bf16\", \"fp16\"; found \"fp8\""));
}

TEST(ConfigTest, SyntaxErrorHasLocation) {
  const std::string message = load_error("seed = 1\n[train]\nsteps = = 3\n");
  EXPECT_TRUE(Contains(message, "test.toml:3:9: TOML syntax error: "));
}

TEST(ConfigTest, ReportsAllProblemsInFileOrder) {
  // File order differs from key order (precision < seed < train.*), which is how toml++ iterates.
  const std::string message = load_error(
      "seed = \"x\"\n"
      "precision = \"fp8\"\n"
      "[train]\n"
      "steps = 0\n"
      "stepz = 1\n",
      {"optim.lr=-1"});
  EXPECT_TRUE(Contains(message, "invalid configuration (5 problems):\n"));
  const std::vector<std::string> in_order = {"test.toml:1:8", "test.toml:2:13", "test.toml:4:9",
                                             "test.toml:5:1", "--set optim.lr=-1: expected >= 0, found -1"};
  size_t previous = 0;
  for (const auto& part : in_order) {
    const size_t at = message.find(part);
    ASSERT_NE(at, std::string::npos) << part << " is not in:\n" << message;
    EXPECT_GT(at, previous) << part << " is out of order in:\n" << message;
    previous = at;
  }
}

TEST(ConfigTest, CapsTheNumberOfProblemsListed) {
  std::string toml;
  for (int i = 0; i < 25; ++i) toml += "unknown_" + std::to_string(i) + " = 1\n";
  const std::string message = load_error(toml);
  EXPECT_TRUE(Contains(message, "(25 problems)"));
  EXPECT_TRUE(Contains(message, "... and 5 more"));
  EXPECT_TRUE(Contains(message, "unknown_9"));
  EXPECT_FALSE(Contains(message, "unknown_24"));
}

// "a.a.a" with `parts` components.
std::string dotted(size_t parts) {
  std::string s = "a";
  for (size_t i = 1; i < parts; ++i) s += ".a";
  return s;
}

// `open` then `inner` nested `depth` times, then `close` as often: nested("{ a = ", "1", " }", 3).
std::string nested(const std::string& open, const std::string& inner, const std::string& close, int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  s += inner;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

TEST(ConfigTest, DeepNestingIsRefusedBeforeParsing) {
  // 10,000 header parts overflowed the loader's stack, 100,000 toml++'s own.
  for (size_t parts : {65u, 10'000u, 100'000u}) {
    const std::string message = load_error("seed = 1\n\n[" + dotted(parts) + "]\nx = 1\n");
    EXPECT_TRUE(Contains(message, "test.toml:3: nesting too deep: expected at most 64 levels of tables, dotted "
                                  "keys, arrays and inline tables, found " + std::to_string(parts)));
    EXPECT_LT(message.size(), 1000u);
  }
  EXPECT_TRUE(Contains(load_error("[[" + dotted(70) + "]]\n"), "test.toml:1: nesting too deep"));
  EXPECT_TRUE(Contains(load_error("[train]\n" + dotted(10'000) + " = 1\n"), "test.toml:2: nesting too deep"));
  EXPECT_TRUE(Contains(load_error("x = { " + dotted(70) + " = 1 }\n"), "test.toml:1: nesting too deep"));
  EXPECT_TRUE(
      Contains(load_error("\nx = " + nested("{ a = ", "1", " }", 100) + "\n"), "test.toml:2: nesting too deep"));
  EXPECT_TRUE(Contains(load_error("x = " + nested("[", "1", "]", 100) + "\n"), "test.toml:1: nesting too deep"));
  EXPECT_TRUE(
      Contains(load_error("x = [\n" + nested("[", "1", "]", 100) + "]\n"), "test.toml:2: nesting too deep"));
  const std::string override_message = load_error("", {"x=" + nested("{ a = ", "1", " }", 100)});
  EXPECT_TRUE(Contains(override_message, "--set x={ a = { a = "));
  EXPECT_TRUE(Contains(override_message, "nesting too deep"));
}

TEST(ConfigTest, NestingWithinTheLimitIsLoadedAsBefore) {
  // Dots inside quoted keys, strings, comments and numbers are no nesting.
  const std::string quoted_key = load_error("[\"" + dotted(100) + "\"]\n");
  EXPECT_FALSE(Contains(quoted_key, "nesting")) << quoted_key;
  EXPECT_TRUE(Contains(quoted_key, "unknown section"));
  const std::string deep_ok = load_error("[" + dotted(63) + "]\nx = 1\n");
  EXPECT_FALSE(Contains(deep_ok, "nesting")) << deep_ok;
  EXPECT_TRUE(Contains(deep_ok, "unknown key"));
  std::string betas = "0.5";
  for (int i = 0; i < 100; ++i) betas += ", 0.5";
  const Config c = parse("run.name = \"\"\"\n[" + dotted(100) + "]\n\"\"\"\n"
                         "precision = 'fp32' # [" + dotted(100) + "]\n"
                         "optim.betas = [" + betas + "]\n"
                         "data.files = [\"" + dotted(100) + "\", '''[[[[''']\n");
  EXPECT_EQ(c.get_string("run.name"), "[" + dotted(100) + "]\n");
  EXPECT_EQ(c.get_float_list("optim.betas").size(), 101u);
  EXPECT_EQ(c.get_string_list("data.files").size(), 2u);
}

// Seconds that `action` takes.
double seconds_of(const std::function<void()>& action) {
  const auto start = std::chrono::steady_clock::now();
  action();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The test schema and 100 more keys: about as many as an app declares, so that a search through all
// of them costs what it costs in the app.
Schema app_sized_schema() {
  Schema s = test_schema();
  for (int i = 0; i < 100; ++i) s.add_int("extra.key_" + std::to_string(i), 0, "a key");
  return s;
}

TEST(ConfigTest, HugeUnknownKeyIsReportedQuicklyAndShortly) {
  const std::string key(10'000'000, 'k');
  std::string message;
  // The "did you mean" search took 54 s for this key, and the message held it whole.
  EXPECT_LT(seconds_of([&] {
              message = error_of([&] { Config::from_string(key + " = 1\n", "test.toml", app_sized_schema()); });
            }),
            5.0);
  EXPECT_LT(message.size(), 1000u);
  EXPECT_TRUE(Contains(message, "unknown key 'kkkkkkkkkk"));
  EXPECT_TRUE(Contains(message, "... (10000000 bytes)' at test.toml:1:1"));
}

TEST(ConfigTest, HugeOverrideIsReportedQuicklyAndShortly) {
  const std::string key(10'000'000, 'k');
  std::string message;
  EXPECT_LT(seconds_of([&] {
              message = error_of([&] { Config::from_string("", "test.toml", app_sized_schema(), {key + "=1"}); });
            }),
            5.0);
  EXPECT_LT(message.size(), 1000u);
  EXPECT_TRUE(Contains(message, "unknown key 'kkkkkkkkkk"));
  EXPECT_TRUE(Contains(message, "(10000000 bytes)"));
  EXPECT_TRUE(Contains(message, "at --set kkkkkkkkkk"));
}

TEST(ConfigTest, HugeValuesAreEchoedShortly) {
  const std::string value(1'000'000, 'v');
  for (const std::string& message :
       {load_error("precision = \"" + value + "\"\n"), load_error("train.steps = \"" + value + "\"\n"),
        load_error("", {"precision=" + value}), load_error("", {"train.steps=" + value})}) {
    EXPECT_LT(message.size(), 1000u);
    EXPECT_TRUE(Contains(message, "vvvvvvvvvv"));
    EXPECT_TRUE(Contains(message, "bytes)"));
  }
}

TEST(ConfigTest, OverridesReplaceFileValues) {
  const Config c = parse("[train]\nsteps = 10\n",
                         {"train.steps=5", "optim.lr=1", "run.name=my-run", "model.layers_per_stage=[3, 5]",
                          "precision=\"bf16\"", "data.files=[\"x.bin\"]", "parallel={ data = 8 }"});
  EXPECT_EQ(c.get_int("train.steps"), 5);
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 1.0);
  EXPECT_EQ(c.get_string("run.name"), "my-run");
  EXPECT_EQ(c.get_int_list("model.layers_per_stage"), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(c.get_string("precision"), "bf16");
  EXPECT_EQ(c.get_string_list("data.files"), (std::vector<std::string>{"x.bin"}));
  EXPECT_EQ(c.get_int("parallel.data"), 8);
}

TEST(ConfigTest, OverrideValuesAreTomlOrElseBareStrings) {
  const Config c = parse("", {"run.name = a b c ", "precision=bf16", "optim.lr=2.5e-4", "train.steps=7"});
  EXPECT_EQ(c.get_string("run.name"), "a b c");
  EXPECT_EQ(c.get_string("precision"), "bf16");
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 2.5e-4);
  EXPECT_EQ(c.get_int("train.steps"), 7);
  // For a string key, text that TOML would read as another type stays the text.
  EXPECT_EQ(parse("", {"run.name=2024-01-01"}).get_string("run.name"), "2024-01-01");
  EXPECT_EQ(parse("", {"run.name=42"}).get_string("run.name"), "42");
  // The last of several overrides of one key wins.
  EXPECT_EQ(parse("", {"train.steps=7", "train.steps=9"}).get_int("train.steps"), 9);
}

TEST(ConfigTest, BadOverridesAreReportedLikeFileProblems) {
  EXPECT_TRUE(Contains(load_error("", {"optim.lrr=1"}),
                       "unknown key 'optim.lrr' at --set optim.lrr=1; did you mean 'optim.lr'?"));
  EXPECT_TRUE(
      Contains(load_error("", {"train.steps=ten"}),
               "key 'train.steps' at --set train.steps=ten: expected an integer, found string \"ten\""));
  EXPECT_TRUE(Contains(load_error("", {"train.steps"}), "'--set train.steps': expected --set KEY=VALUE"));
  EXPECT_TRUE(Contains(load_error("", {"=3"}), "expected --set KEY=VALUE"));
}

TEST(ConfigTest, ToTomlRoundTrips) {
  const Config c = parse(
      "seed = -3\n"
      "[optim]\n"
      "lr = 1e-5\n"
      "betas = [0.30000000000000004, 1]\n",
      {"run.name=say \"hi\" \\ bye", "parallel.tensor.size=2", "data.files=[\"a\", \"b c\"]",
       "train.compile=true"});
  const std::string printed = c.to_toml();
  EXPECT_TRUE(Contains(printed, "seed = -3  # test.toml:1\n"));
  EXPECT_TRUE(Contains(printed, "[parallel]\ndata = 1\ntensor.size = 2  # --set\n"));
  EXPECT_TRUE(Contains(
      printed, "[optim]\nbetas = [0.30000000000000004, 1.0]  # test.toml:4\nlr = 1e-05  # test.toml:3\n"));
  // Top-level keys come before the first section, or TOML would put them in that section.
  EXPECT_LT(printed.find("precision = \"fp32\""), printed.find('['));
  const Config again = Config::from_string(printed, "printed.toml", test_schema());
  EXPECT_TRUE(again == c) << printed << "\n---\n" << again.to_toml();
  EXPECT_EQ(again.get_string("run.name"), "say \"hi\" \\ bye");
  EXPECT_TRUE(again != parse("")) << "the round trip must keep the non-default values";
}

TEST(ConfigTest, LoadReadsFileAndNamesItInErrors) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/config_test_quickstart.toml";
  std::ofstream(path) << "[train]\nsteps = 3\n";
  const Config c = Config::load(path, test_schema(), {"optim.lr=0.5"});
  EXPECT_EQ(c.get_int("train.steps"), 3);
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 0.5);
  EXPECT_EQ(c.path(), path);
  EXPECT_EQ(c.source_of("train.steps"), path + ":2");

  std::ofstream(path) << "[train]\nsteps = \"x\"\n";
  EXPECT_TRUE(
      Contains(error_of([&] { Config::load(path, test_schema()); }), path + ":2:9: expected an integer"));
  std::filesystem::remove(path);
}

TEST(ConfigTest, MissingFileNamesThePath) {
  EXPECT_TRUE(Contains(error_of([] { Config::load("/nonexistent/kuafu/quickstart.toml", test_schema()); }),
                       "config file '/nonexistent/kuafu/quickstart.toml' does not exist"));
}

TEST(ConfigTest, GettersRejectUndeclaredKeysAndWrongTypes) {
  const Config c = parse("");
  EXPECT_TRUE(
      Contains(error_of([&] { c.get_int("train.stepz"); }),
               "config key 'train.stepz' is not declared in the schema; did you mean 'train.steps'?"));
  EXPECT_TRUE(Contains(error_of([&] { c.get_float("train.steps"); }),
                       "config key 'train.steps' holds an integer, not a float"));
  EXPECT_TRUE(Contains(error_of([&] { c.is_set("nope"); }), "config key 'nope' is not declared"));
}

TEST(ConfigTest, FailAtPointsAtTheKeysSource) {
  const Config c = parse("[parallel]\ndata = 3\n", {"train.steps=7"});
  EXPECT_EQ(error_of([&] { c.fail_at("parallel.data", "must divide the batch size 8"); }),
            "invalid configuration: key 'parallel.data' at test.toml:2:8: must divide the batch size 8");
  EXPECT_EQ(error_of([&] { c.fail_at("train.steps", "too many"); }),
            "invalid configuration: key 'train.steps' at --set train.steps=7: too many");
  EXPECT_EQ(error_of([&] { c.fail_at("seed", "odd"); }),
            "invalid configuration: key 'seed' (default 1234): odd");
}

TEST(ConfigTest, SchemaRejectsBadDeclarations) {
  Schema s;
  s.add_int("train.steps", 1, "steps");
  EXPECT_THROW(s.add_int("train.steps", 1, "again"), Error);
  EXPECT_THROW(s.add_int("train", 1, "a key that is also a section"), Error);
  EXPECT_THROW(s.add_int("train.steps.inner", 1, "inside a value"), Error);
  EXPECT_THROW(s.add_int("bad key", 1, "space"), Error);
  EXPECT_THROW(s.add_int("a..b", 1, "empty part"), Error);
  EXPECT_THROW(s.add_int("low", 0, "default below min").min(1), Error);
  EXPECT_THROW(s.add_string("mode", "x", "default not a choice").choices({"a", "b"}), Error);
  EXPECT_THROW(s.add_int("n", 0, "choices on an int").choices({"a"}), Error);
  EXPECT_THROW(s.add_bool("flag", false, "min on a bool").min(0), Error);

  Schema app;
  app.add_int("model.layers", 12, "layers");
  EXPECT_NO_THROW(s.merge(app));
  EXPECT_NE(s.find("model.layers"), nullptr);
  EXPECT_THROW(s.merge(app), Error);
}

TEST(ConfigTest, SchemaDescribesFields) {
  const std::string text = test_schema().describe();
  EXPECT_TRUE(Contains(text, "train.steps (an integer, default 1000, >= 1): number of optimizer steps"));
  EXPECT_TRUE(
      Contains(text, "precision (a string, default \"fp32\", one of fp32|bf16|fp16): compute precision"));
}

TEST(TextTest, Helpers) {
  EXPECT_EQ(text::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(text::edit_distance("", "abc"), 3u);
  EXPECT_EQ(text::edit_distance("same", "same"), 0u);
  EXPECT_EQ(text::closest_match("trian", {"prepare", "train", "eval"}, 2), "train");
  EXPECT_EQ(text::closest_match("zzzzz", {"prepare", "train", "eval"}, 2), "");
  EXPECT_EQ(text::split("a.b..c", '.'), (std::vector<std::string>{"a", "b", "", "c"}));
  EXPECT_EQ(text::split("", '.'), (std::vector<std::string>{""}));
  EXPECT_EQ(text::trim(" \t x y \n"), "x y");
  EXPECT_EQ(text::trim("   "), "");
  EXPECT_EQ(text::join({"a", "b", "c"}, ", "), "a, b, c");
  EXPECT_EQ(text::join({}, ", "), "");
  EXPECT_TRUE(text::starts_with("--config", "--"));
  EXPECT_FALSE(text::starts_with("-", "--"));
}

TEST(TextTest, BoundedEditDistanceAndAbbreviation) {
  EXPECT_EQ(text::edit_distance("kitten", "sitting", 3), 3u);
  EXPECT_EQ(text::edit_distance("kitten", "sitting", 2), 3u) << "beyond the limit: limit + 1";
  EXPECT_EQ(text::edit_distance(std::string(10'000'000, 'x'), "train", 2), 3u);
  EXPECT_EQ(text::closest_match(std::string(10'000'000, 'x'), {"train"}, 5'000'000), "");
  EXPECT_EQ(text::abbreviate("short"), "short");
  EXPECT_EQ(text::abbreviate(std::string(100, 'a')), std::string(100, 'a'));
  EXPECT_EQ(text::abbreviate(std::string(101, 'a')), std::string(100, 'a') + "... (101 bytes)");
  EXPECT_EQ(text::abbreviate("abcdef", 3), "abc... (6 bytes)");
}

}  // namespace
}  // namespace kuafu::config

// The model recipe's builder: for each purpose it makes a model as that model's own section
// (models.<name> over the top-level keys) says — whole in float32 for evaluation, generation and export;
// for training and benchmarks, float32, described for a sharded strategy, a frozen base in the compute
// dtype (in host memory under memory.offload_frozen) with float32 adapters, or a frozen model as
// FrozenModel holds it — and every way gives the values of one eager draw.
#include <gtest/gtest.h>

#include <map>

#include "core/config/config.h"
#include "core/parallel/tensor/factory.h"
#include "core/train/model_recipe.h"
#include "core/train/runtime.h"
#include "core/train/trainer.h"

namespace kuafu::train {
namespace {

// Two weights drawn as a serial model draws them (normal, then uniform), and a LoRA-like adapter the
// recipe's `adapt` adds.
struct RecipeToyImpl : torch::nn::Module {
  explicit RecipeToyImpl(const torch::Device& device) {
    weight = register_parameter("weight", torch::empty({6, 4}, torch::TensorOptions().device(device)));
    bias = register_parameter("bias", torch::empty({6}, torch::TensorOptions().device(device)));
  }
  void initialize() {
    parallel::initialize_like_serial(*this, parallel::TensorParallel(), [](const std::string& name, torch::Tensor& full) {
      if (name == "weight") full.normal_(0.0, 0.02);
      if (name == "bias") full.uniform_(-1.0, 1.0);
      return true;
    });
  }
  void add_adapter(const torch::Device& device) {
    adapter = register_parameter("adapter", torch::zeros({2, 4}, torch::TensorOptions().device(device)));
  }
  torch::Tensor weight, bias, adapter;
};
TORCH_MODULE(RecipeToy);

ModelRecipe<RecipeToy> toy_recipe(const std::string& name, bool trained, bool adapted) {
  ModelRecipe<RecipeToy> recipe{name, trained};
  recipe.describe = [](const parallel::ModelOptions&) { return RecipeToy(torch::kMeta); };
  recipe.draw = [](RecipeToy& toy) {
    torch::manual_seed(11);
    toy->initialize();
  };
  // "Starting weights": the bias read from a "folder" (here a constant).
  recipe.load = [](RecipeToy& toy) {
    torch::NoGradGuard no_grad;
    if (toy->bias.is_meta()) {
      const WeightSink* sink = current_weight_sink();
      if (sink && sink->wants("bias")) sink->take("bias", torch::full({6}, 0.5));
      return;
    }
    toy->bias.fill_(0.5);
  };
  if (adapted) {
    recipe.adapt = [](RecipeToy& toy, std::optional<torch::Device> host_base) {
      toy->add_adapter(host_base.value_or(toy->weight.device()));
    };
  }
  return recipe;
}

config::Config toy_config(const std::vector<std::string>& overrides) {
  config::Schema schema;
  add_runtime_schema(schema);
  add_trainer_schema(schema);
  add_model_sections(schema, {"actor", "reference"});
  return config::Config::from_string("", "recipe.toml", schema, overrides);
}

// The eager model's values: drawn from the recipe's seed, the bias then loaded.
std::map<std::string, torch::Tensor> eager_values(bool starting_weights) {
  RecipeToy toy(torch::kCPU);
  torch::manual_seed(11);
  toy->initialize();
  return {{"weight", toy->weight.detach().clone()},
          {"bias", starting_weights ? torch::full({6}, 0.5) : toy->bias.detach().clone()}};
}

void expect_values(RecipeToy& toy, torch::Dtype dtype, bool starting_weights) {
  for (const auto& [name, expected] : eager_values(starting_weights)) {
    const torch::Tensor value = toy->named_parameters()[name];
    EXPECT_EQ(value.scalar_type(), dtype) << name;
    EXPECT_TRUE(torch::equal(value.cpu(), expected.to(dtype))) << name;
  }
}

const parallel::ModelOptions kCpu = parallel::ModelOptions::serial_on(torch::kCPU);

TEST(ModelRecipeTest, EvaluationGenerationAndExportMakeTheWholeModelInFloat32) {
  // Whatever the sections say of training, the other purposes run the whole model in float32.
  const config::Config config = toy_config({"memory.strategy=gemini", "models.actor.precision.dtype=bf16"});
  for (const Purpose purpose : {Purpose::evaluate, Purpose::generate, Purpose::export_weights}) {
    for (const bool starting_weights : {true, false}) {
      Built<RecipeToy> built = build(toy_recipe("actor", true, false), config, {purpose, kCpu, starting_weights});
      EXPECT_FALSE(built.deferred);
      expect_values(built.model, torch::kFloat32, starting_weights);
    }
  }
}

TEST(ModelRecipeTest, TrainingReadsTheStrategyFromTheModelsOwnSection) {
  // Top level zero2, the actor's own section none: the actor is materialised in float32 (masters come from it).
  const config::Config config = toy_config({"memory.strategy=zero2", "models.actor.memory.strategy=none"});
  Built<RecipeToy> actor = build(toy_recipe("actor", true, false), config, {Purpose::train, kCpu});
  EXPECT_FALSE(actor.deferred);
  expect_values(actor.model, torch::kFloat32, true);

  // A model without a section of its own ("") follows the top level: left described, and the deferred
  // weights replay the draws and then the starting weights into the sink, equal to the eager model.
  Built<RecipeToy> described = build(toy_recipe("", true, false), config, {Purpose::benchmark, kCpu});
  ASSERT_TRUE(described.deferred);
  for (const auto& p : described.model->parameters()) EXPECT_TRUE(p.is_meta());
  std::map<std::string, torch::Tensor> filled;
  const WeightSink sink{torch::kCPU, [](const std::string&) { return true; },
                        [&](const std::string& name, const torch::Tensor& value) { filled[name] = value.clone(); }};
  {
    const ScopedWeightSink scope(sink);
    described.deferred.initialize();
    EXPECT_TRUE(static_cast<bool>(described.deferred.load)) << "the benchmark was given starting weights";
    described.deferred.load();
  }
  const auto expected = eager_values(true);
  EXPECT_TRUE(torch::equal(filled.at("weight"), expected.at("weight")));
  EXPECT_TRUE(torch::equal(filled.at("bias"), expected.at("bias")));

  // The same without starting weights carries no load.
  EXPECT_FALSE(build(toy_recipe("", true, false), config, {Purpose::benchmark, kCpu, false}).deferred.load);
}

TEST(ModelRecipeTest, AnAdaptedModelsBaseIsFrozenInTheComputeDtypeAndNeverDeferred) {
  const config::Config config = toy_config({"models.actor.memory.strategy=zero2", "models.actor.precision.dtype=bf16"});
  Built<RecipeToy> actor = build(toy_recipe("actor", true, true), config, {Purpose::train, kCpu});
  EXPECT_FALSE(actor.deferred);
  expect_values(actor.model, torch::kBFloat16, true);  // drawn in float32, then cast: the eager values in bf16
  ASSERT_TRUE(actor.model->adapter.defined());
  EXPECT_EQ(actor.model->adapter.scalar_type(), torch::kFloat32);

  // Evaluated, the same recipe's base is float32.
  Built<RecipeToy> evaluated = build(toy_recipe("actor", true, true), config, {Purpose::evaluate, kCpu});
  expect_values(evaluated.model, torch::kFloat32, true);
}

TEST(ModelRecipeTest, AFrozenModelIsMadeAsFrozenModelHoldsIt) {
  // The reference's own dtype and offload; the top-level strategy does not apply to a frozen model.
  const config::Config config = toy_config({"memory.strategy=gemini", "models.reference.precision.dtype=bf16",
                                            "models.reference.memory.offload_frozen=true"});
  const Placing placing = placing_for(config, "reference", {Purpose::train, kCpu}, /*trained=*/false, /*frozen_base=*/false);
  EXPECT_FALSE(placing.described);
  ASSERT_TRUE(static_cast<bool>(placing.how.on_host));
  EXPECT_TRUE(placing.how.on_host("weight"));
  Built<RecipeToy> reference = build(toy_recipe("reference", false, false), config, {Purpose::train, kCpu});
  EXPECT_FALSE(reference.deferred);
  expect_values(reference.model, torch::kBFloat16, true);
  // Evaluated: float32, in place.
  const Materialization evaluated = placing_for(config, "reference", {Purpose::evaluate, kCpu}, false, false).how;
  EXPECT_FALSE(static_cast<bool>(evaluated.on_host));
  EXPECT_EQ(evaluated.dtype_of("weight"), torch::kFloat32);
  // Made as a caller places it (build_as): no section read, the folder's read as its draws.
  RecipeToy placed = build_as(toy_recipe("reference", false, false), Materialization::all_in(torch::kCPU, torch::kBFloat16));
  expect_values(placed, torch::kBFloat16, true);
}

TEST(ModelRecipeTest, ALoadThatGivesEveryWeightReplacesTheDraws) {
  // A folder that holds every weight is read instead of the draws (nothing is filled twice): here the
  // draws would fail, so only the load may run.
  ModelRecipe<RecipeToy> recipe{"", true};
  recipe.describe = [](const parallel::ModelOptions&) { return RecipeToy(torch::kMeta); };
  recipe.draw = [](RecipeToy&) { FAIL() << "drawn although the folder gives every weight"; };
  recipe.load = [](RecipeToy& toy) {
    torch::NoGradGuard no_grad;
    toy->weight.fill_(2.0);
    toy->bias.fill_(3.0);
  };
  recipe.load_gives_every_weight = true;
  Built<RecipeToy> built = build(recipe, toy_config({}), {Purpose::train, kCpu});
  EXPECT_TRUE(torch::equal(built.model->weight, torch::full({6, 4}, 2.0)));
  EXPECT_TRUE(torch::equal(built.model->bias, torch::full({6}, 3.0)));
}

}  // namespace
}  // namespace kuafu::train

#include "apps/chat_rlhf/commands.h"

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "apps/chat_rlhf/chat_session.h"
#include "apps/chat_rlhf/dpo_stage.h"
#include "apps/chat_rlhf/reward_stage.h"
#include "apps/chat_rlhf/rl_stage.h"
#include "apps/chat_rlhf/stage_config.h"
#include "core/train/peft_adapter.h"
#include "apps/opt_finetune/commands.h"

namespace kuafu::chat {
namespace {

const char* const kUsage =
    "usage: kuafu-chat STAGE [COMMAND] --config FILE [--set key=value ...]\n"
    "\n"
    "RLHF on OPT or GPT-2 models (model.init_from: a Hugging Face folder of either), every stage's\n"
    "output a Hugging Face folder:\n"
    "  sft    supervised fine-tuning on conversations (the loss on the assistant's tokens)\n"
    "  rm     the reward model on preference pairs (OPT- or GPT2ForSequenceClassification)\n"
    "  dpo    direct preference optimisation of the SFT model\n"
    "  ppo    PPO from the reward model (actor, critic, frozen reference and reward model)\n"
    "  grpo   GRPO from the reward model (groups of samples per prompt)\n"
    "  chat   talk to any stage's exported folder (kuafu-chat chat --help)\n"
    "  benchmark  a PPO step timed by part (kuafu-chat ppo benchmark --config FILE)\n"
    "\n"
    "Each stage's COMMAND is train (the default), eval, export, benchmark, or generate for a policy;\n"
    "`kuafu-chat STAGE --help` lists them and their options.\n";

train::AppDefinition stage_definition(Stage stage) {
  train::AppDefinition app;
  app.program = std::string("kuafu-chat ") + stage_name(stage);
  app.schema = stage_schema(stage);
  app.item_help = "random tokens";
  switch (stage) {
    case Stage::Sft:
      app.description = "supervised fine-tuning on conversations (JSONL prompt/response or messages), full or LoRA";
      app.make_app = opt::make_opt_app;
      app.add_options = train::add_adapter_option;
      app.generates = true;
      app.export_help = "an OPTForCausalLM or GPT2LMHeadModel folder, adapters merged; --adapter: a PEFT adapter folder";
      app.eval_help = "held-out answer loss and perplexity of a checkpoint";
      break;
    case Stage::Reward:
      app.description = "the reward model on preference pairs: pairwise loss, held-out accuracy per kind";
      app.make_app = make_reward_app;
      app.export_help = "an OPT- or GPT2ForSequenceClassification folder with score.weight";
      app.eval_help = "held-out pairwise accuracy (overall and per kind) and mean margin of a checkpoint";
      app.item_help = "random pairs";
      break;
    case Stage::Dpo:
      app.description = "direct preference optimisation (DPO or IPO) against the frozen SFT model";
      app.make_app = make_dpo_app;
      app.add_options = train::add_adapter_option;
      app.generates = true;
      app.export_help = "an OPTForCausalLM or GPT2LMHeadModel folder, adapters merged; --adapter: a PEFT adapter folder";
      app.eval_help = "held-out preference accuracy and reward margin of a checkpoint";
      break;
    case Stage::Ppo:
    case Stage::Grpo: {
      const bool ppo = stage == Stage::Ppo;
      app.description = ppo ? "PPO from the reward model: actor and critic, KL to the frozen SFT model in the reward, GAE"
                            : "GRPO from the reward model: groups of samples per prompt, group-normalised advantages";
      app.make_app = [stage](const config::Config& config) { return make_rl_app(config, stage); };
      app.add_options = train::add_adapter_option;
      app.generates = true;
      app.export_help = "the actor as an OPTForCausalLM or GPT2LMHeadModel folder, adapters merged; --adapter: a PEFT adapter folder";
      app.eval_help = "held-out reward, KL to the reference, length, EOS rate and answer F1 of greedy answers";
      app.item_help = "random prompts (generation with and without the KV cache, experience, an update)";
      break;
    }
  }
  return app;
}

}  // namespace

int run_chat_app(int argc, const char* const argv[]) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::cout << kUsage;
    return argc < 2 ? 1 : 0;
  }
  const std::string stage = argv[1];
  if (stage == "chat") return run_chat(argc - 1, argv + 1);
  if (stage == "benchmark") {  // the PPO step: kuafu-chat ppo benchmark
    const train::AppDefinition app = stage_definition(Stage::Ppo);
    std::vector<const char*> args = {app.program.c_str(), "benchmark"};
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    return train::run_app(app, static_cast<int>(args.size()), args.data());
  }
  for (const Stage s : {Stage::Sft, Stage::Reward, Stage::Dpo, Stage::Ppo, Stage::Grpo}) {
    if (stage != stage_name(s)) continue;
    const train::AppDefinition app = stage_definition(s);
    // `kuafu-chat rm --config F`: the stage's training command.
    std::vector<const char*> args = {app.program.c_str()};
    if (argc < 3 || (argv[2][0] == '-' && std::strcmp(argv[2], "--help") != 0 && std::strcmp(argv[2], "-h") != 0)) {
      args.push_back(app.train_name.c_str());
    }
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    return train::run_app(app, static_cast<int>(args.size()), args.data());
  }
  std::cerr << "kuafu-chat: error: unknown stage \"" << stage << "\"\n\n" << kUsage;
  return 1;
}

}  // namespace kuafu::chat

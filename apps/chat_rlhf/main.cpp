// kuafu-chat: SFT, reward model, DPO, PPO and GRPO on OPT, GPT-2 and Llama-family models, and a chat front end (commands.h).
#include "apps/chat_rlhf/commands.h"
#include "core/util/process_setup.h"

int main(int argc, char** argv) {
  kuafu::set_up_process(argv);
  return kuafu::chat::run_chat_app(argc, argv);
}

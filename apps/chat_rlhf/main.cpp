// kuafu-chat: SFT, reward model, DPO, PPO and GRPO on OPT models, and a chat front end (commands.h).
#include "apps/chat_rlhf/commands.h"

int main(int argc, char** argv) { return kuafu::chat::run_chat_app(argc, argv); }

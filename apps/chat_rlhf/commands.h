// kuafu-chat: the RLHF pipeline's stages as one program. Each stage is a program of its own inside it,
// with its own config: `kuafu-chat sft|rm|dpo|ppo|grpo [train|eval|export|generate|benchmark] --config
// FILE` (train when no command is named), `kuafu-chat chat` (an interactive terminal over any stage's
// folder) and `kuafu-chat benchmark` (the PPO step, timed by part).
#pragma once

namespace kuafu::chat {

int run_chat_app(int argc, const char* const argv[]);

}  // namespace kuafu::chat

#include "apps/chat_rlhf/chat_session.h"

#include <signal.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "apps/opt_finetune/causal_lm_family.h"
#include "core/util/device.h"
#include "core/util/error.h"
#include "core/util/logging.h"
#include "core/util/text.h"
#include "core/util/utf8.h"

namespace kuafu::chat {

ChatSession::ChatSession(nn::CausalLMPtr model, std::shared_ptr<const io::BpeTokenizer> tokenizer,
                         io::InstructionFormat format, nn::SamplingOptions sampling)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), format_(std::move(format)), sampling_(std::move(sampling)) {
  model_->module().eval();
  sampling_.stop_tokens = format_.stop_tokens();
  sampling_.vocab_limit = tokenizer_->vocab_size();
}

std::vector<int64_t> ChatSession::render(size_t first, const std::string& message) const {
  const std::vector<std::pair<std::string, std::string>> kept(turns_.begin() + static_cast<std::ptrdiff_t>(first), turns_.end());
  return io::conversation_prompt_tokens(kept, message, *tokenizer_, format_);
}

std::string ChatSession::reply(const std::string& message, const std::function<void(const std::string&)>& stream,
                               const std::function<void(const std::string&)>& notice, const std::function<bool()>& interrupted) {
  const int64_t context = model_->positions();
  const int64_t room = std::min<int64_t>(sampling_.max_new_tokens, context / 2);  // an answer's share of the context
  size_t first = 0;
  std::vector<int64_t> prompt = render(first, message);
  while (static_cast<int64_t>(prompt.size()) + room > context && first < turns_.size()) {
    prompt = render(++first, message);
  }
  if (first > 0) {
    notice("(the " + std::to_string(first) + " oldest turn" + (first > 1 ? "s" : "") + " dropped: the conversation " +
           "no longer fits the model's " + std::to_string(context) + " positions)");
    turns_.erase(turns_.begin(), turns_.begin() + static_cast<std::ptrdiff_t>(first));
  }
  KUAFU_CHECK(static_cast<int64_t>(prompt.size()) + 1 <= context, "the message is ", prompt.size(),
              " tokens: no room for an answer within the model's ", context, " positions");
  nn::SamplingOptions sampling = sampling_;
  sampling.max_new_tokens = std::min<int64_t>(sampling_.max_new_tokens, context - static_cast<int64_t>(prompt.size()));
  sampling.seed = sampling_.seed + static_cast<uint64_t>(replies_++);
  std::vector<int64_t> answer;
  std::string bytes;
  text::Utf8Stream pieces;
  auto give = [&](const std::string& piece) {
    if (!piece.empty()) stream(piece);
  };
  sampling.on_token = [&](size_t, int64_t token) {
    if (sampling_.stops_at(token)) return;
    answer.push_back(token);
    bytes = tokenizer_->decode(answer);  // byte-level BPE: a prefix of the ids decodes to a prefix of the bytes
    give(pieces.next(bytes));
  };
  sampling.interrupted = interrupted;
  nn::generate(nn::decoder_of(model_), prompt, sampling);
  give(pieces.finish(bytes));
  const std::string text = text::replace_invalid_utf8(bytes);
  turns_.emplace_back(message, text);
  return text;
}

void ChatSession::set(const std::string& name, const std::string& value) { set_sampling_option(sampling_, name, value); }

void set_sampling_option(nn::SamplingOptions& sampling, const std::string& name, const std::string& value) {
  auto number = [&](double low, double high) {
    double v = 0;
    size_t used = 0;
    try {
      v = std::stod(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KUAFU_CHECK(used > 0 && used == value.size(), name, ": \"", text::abbreviate(value), "\" is not a number");
    KUAFU_CHECK(v >= low && v <= high, name, " must be in [", low, ", ", high, "], got ", value);
    return v;
  };
  if (name == "temperature") {
    sampling.temperature = number(0, 100);
  } else if (name == "top_k") {
    sampling.top_k = static_cast<int64_t>(number(0, 1e9));
  } else if (name == "top_p") {
    sampling.top_p = number(1e-6, 1);
  } else if (name == "max_new_tokens") {
    sampling.max_new_tokens = static_cast<int64_t>(number(1, 1e9));
  } else if (name == "seed") {
    sampling.seed = static_cast<uint64_t>(number(0, 1e18));
  } else {
    fail("unknown setting \"" + text::abbreviate(name) + "\" (temperature, top_k, top_p, max_new_tokens, seed)");
  }
}

namespace {

volatile std::sig_atomic_t g_interrupts = 0;
void on_sigint(int) { g_interrupts = g_interrupts + 1; }

const char* const kChatHelp =
    "usage: kuafu-chat chat --model DIR [--prompt TEXT] [--temperature T] [--top-k K] [--top-p P]\n"
    "                       [--max-new-tokens N] [--seed S]\n"
    "\n"
    "Chat with a policy: any stage's exported folder (OPTForCausalLM or GPT2LMHeadModel with its tokenizer). Replies stream as\n"
    "they are generated; the conversation keeps its turns within the model's context (the oldest dropped\n"
    "with a notice). At the prompt: /reset clears the conversation, /set NAME VALUE changes temperature,\n"
    "top_k, top_p, max_new_tokens or seed, /quit (or Ctrl-D) leaves; Ctrl-C stops a reply, and at the\n"
    "prompt leaves. --prompt answers once and exits, for scripts. Defaults: greedy (temperature 0),\n"
    "200 new tokens.\n";

}  // namespace

int run_chat(int argc, const char* const argv[]) {
  std::string model_dir, prompt, device = "cpu";
  nn::SamplingOptions sampling;
  sampling.temperature = 0;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::cout << kChatHelp;
        return 0;
      }
      KUAFU_CHECK(text::starts_with(arg, "--"), "unexpected argument \"", text::abbreviate(arg), "\" (kuafu-chat chat --help)");
      KUAFU_CHECK(i + 1 < argc, arg, " needs a value (kuafu-chat chat --help)");
      const std::string value = argv[++i];
      if (arg == "--model") {
        model_dir = value;
      } else if (arg == "--prompt") {
        prompt = value;
      } else if (arg == "--device") {
        device = value;
      } else {
        std::string name = arg.substr(2);
        for (char& c : name) c = c == '-' ? '_' : c;
        set_sampling_option(sampling, name, value);  // names an unknown option
      }
    }
    KUAFU_CHECK(!model_dir.empty(), "--model DIR is required: a stage's exported folder (kuafu-chat chat --help)");
    KUAFU_CHECK(std::filesystem::is_directory(model_dir), "--model ", model_dir, " is not a folder (a stage's export --out)");
    if (!prompt.empty()) log::set_level(log::Level::kWarn);  // stdout holds the answer alone, for scripts
    auto tokenizer = std::make_shared<io::BpeTokenizer>(io::BpeTokenizer::from_folder(model_dir));
    nn::CausalLMPtr model = opt::load_causal_lm(model_dir, resolve_device(device, 0));
    const opt::LmShape::SpecialIds ids = opt::shape_of(*model).special_ids(*tokenizer, model_dir);
    io::InstructionFormat format;
    format.bos = ids.bos;
    format.eos = ids.eos;
    io::use_folder_template(format, model_dir, *tokenizer);  // the folder's chat template, when it has one
    format.also_stop = io::generation_eos_ids(model_dir);
    ChatSession session(model, tokenizer, format, sampling);
    auto stream = [](const std::string& piece) { std::cout << piece << std::flush; };
    auto notice = [](const std::string& line) { std::cerr << line << "\n"; };
    if (!prompt.empty()) {
      session.reply(prompt, stream, notice);
      std::cout << std::endl;
      return 0;
    }
    // Ctrl-C interrupts the read at the prompt (no SA_RESTART) and stops a reply between tokens.
    struct sigaction action {};
    action.sa_handler = on_sigint;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, nullptr);
    std::cout << "kuafu-chat: " << model_dir << " (" << session.sampling().max_new_tokens
              << " new tokens at most; /reset, /set NAME VALUE, /quit)" << std::endl;
    while (true) {
      std::cout << "> " << std::flush;
      g_interrupts = 0;
      std::string line;
      if (!std::getline(std::cin, line)) {
        std::cout << std::endl;
        break;  // end of input, or Ctrl-C at the prompt
      }
      line = text::trim(line);
      if (line.empty()) continue;
      if (line == "/quit" || line == "/exit") break;
      if (line == "/reset") {
        session.reset();
        std::cout << "(conversation cleared)" << std::endl;
        continue;
      }
      if (text::starts_with(line, "/set")) {
        std::istringstream words(line.substr(4));
        std::string name, value;
        words >> name >> value;
        try {
          session.set(name, value);
          std::cout << "(" << name << " = " << value << ")" << std::endl;
        } catch (const Error& e) {
          std::cout << "(/set " << e.what() << ")" << std::endl;
        }
        continue;
      }
      if (line[0] == '/') {
        std::cout << "(unknown command " << line << ": /reset, /set NAME VALUE, /quit)" << std::endl;
        continue;
      }
      // A message the session cannot answer (too long for the context, not text) leaves the
      // conversation as it was: a notice, and the prompt again.
      try {
        session.reply(line, stream, notice, [] { return g_interrupts > 0; });
      } catch (const std::exception& e) {
        std::cout << "(not answered: " << text::abbreviate(e.what(), 300) << ")" << std::endl;
        continue;
      }
      if (g_interrupts > 0) std::cout << " [stopped]";
      std::cout << std::endl;
    }
    return 0;
  } catch (const Error& e) {
    std::cerr << "kuafu-chat chat: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace kuafu::chat

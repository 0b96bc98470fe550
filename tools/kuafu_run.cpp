// kuafu-run: torchrun's job for C++ programs. Starts N ranks with the torchrun environment, stops
// them all when one fails, and passes Ctrl-C on to them so that training can checkpoint.
#include <boost/program_options.hpp>

#include <iostream>
#include <string>
#include <vector>

#include "core/dist/launcher.h"
#include "core/util/error.h"

namespace po = boost::program_options;

namespace {

const char* const kUsage =
    "usage: kuafu-run [options] PROGRAM [ARGS...]\n"
    "\n"
    "Starts --nproc-per-node copies of PROGRAM with the torchrun environment (RANK, WORLD_SIZE,\n"
    "LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT and\n"
    "OMP_NUM_THREADS unless set). Options go before PROGRAM; everything after it is passed on.\n"
    "When a rank fails the others get SIGTERM, then SIGKILL after the grace period, and kuafu-run\n"
    "exits with that rank's code (128 + signal if it was killed). SIGINT and SIGTERM are passed\n"
    "on to the ranks; a second one kills them.\n";

po::options_description make_options(kuafu::dist::LaunchOptions& o) {
  po::options_description desc("options");
  desc.add_options()
      ("help,h", "print this help")
      ("nproc-per-node", po::value(&o.nproc_per_node)->default_value(1), "ranks on this node")
      ("nnodes", po::value(&o.nnodes)->default_value(1), "number of nodes")
      ("node-rank", po::value(&o.node_rank)->default_value(0), "index of this node, 0 to nnodes-1")
      ("master-addr", po::value(&o.master_addr)->default_value("127.0.0.1"),
       "address of the node with rank 0")
      ("master-port", po::value(&o.master_port)->default_value(29500),
       "port of the rendezvous store; 0 picks a free one (single node only)")
      ("timeout-grace", po::value(&o.timeout_grace_s)->default_value(10.0),
       "seconds between SIGTERM and SIGKILL when stopping the ranks");
  return desc;
}

// Index of PROGRAM: the first word that is neither an option nor an option's value, or the word
// after "--". Splitting here keeps the program's own --flags away from the parser. `options_end`
// is where kuafu-run's own options end.
int find_program(int argc, char** argv, const po::options_description& desc, int* options_end) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    *options_end = i;
    if (arg == "--") return i + 1;
    if (arg.size() < 2 || arg[0] != '-') return i;
    if (arg.rfind("--", 0) != 0 || arg.find('=') != std::string::npos) continue;
    const auto* option = desc.find_nothrow(arg.substr(2), false);
    if (option != nullptr && option->semantic()->max_tokens() > 0) ++i;  // skip its value
  }
  *options_end = argc;
  return argc;
}

int usage_error(const std::string& message, const po::options_description& desc) {
  std::cerr << "kuafu-run: error: " << message << "\n\n" << kUsage << "\n" << desc;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  kuafu::dist::LaunchOptions options;
  const po::options_description desc = make_options(options);
  int options_end = 1;
  const int program = find_program(argc, argv, desc, &options_end);

  po::variables_map vars;
  try {
    const std::vector<std::string> option_args(argv + 1, argv + options_end);
    const auto style = po::command_line_style::default_style &
                       ~po::command_line_style::allow_guessing;  // find_program needs exact names
    po::store(po::command_line_parser(option_args).options(desc).style(style).run(), vars);
    po::notify(vars);
  } catch (const po::error& e) {
    return usage_error(e.what(), desc);
  }
  if (vars.count("help")) {
    std::cout << kUsage << "\n" << desc;
    return 0;
  }
  if (program >= argc) return usage_error("no PROGRAM given", desc);

  try {
    return kuafu::dist::run_ranks(options, std::vector<std::string>(argv + program, argv + argc));
  } catch (const std::exception& e) {  // kuafu::Error, and any other rather than an abort
    std::cerr << "kuafu-run: error: " << e.what() << "\n";
    return 1;
  }
}

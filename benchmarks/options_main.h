// The main() of a benchmark program configured by Boost.Program_options: --help prints the options,
// and any error is printed with the program's name before exiting 1.
#pragma once

#include <boost/program_options.hpp>

#include <functional>
#include <iostream>
#include <string>

namespace kuafu::benchmarks {

inline int options_main(int argc, char** argv, const std::string& program,
                        boost::program_options::options_description described,
                        const std::function<int(const boost::program_options::variables_map&)>& run) {
  namespace po = boost::program_options;
  described.add_options()("help", "this text");
  try {
    po::variables_map args;
    po::store(po::parse_command_line(argc, argv, described), args);
    po::notify(args);
    if (args.count("help")) {
      std::cout << described << std::endl;
      return 0;
    }
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace kuafu::benchmarks

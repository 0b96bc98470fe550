// Encodes a text file with a byte-level BPE tokenizer.json, `repeats` times from a cold cache (a fresh
// tokenizer each time), and prints one JSON line: MB/s (median and best), tokens, and a checksum of the
// ids for comparing with another implementation.
// Usage: bpe_tokenizer_speed TOKENIZER_JSON TEXT [REPEATS]
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "core/io/bpe_tokenizer.h"
#include "core/util/atomic_file.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: bpe_tokenizer_speed TOKENIZER_JSON TEXT [REPEATS]\n";
    return 2;
  }
  const std::string text = kuafu::read_file(argv[2]);
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  std::vector<double> seconds;
  std::vector<int64_t> ids;
  for (int r = 0; r < repeats; ++r) {
    const auto tokenizer = kuafu::io::BpeTokenizer::from_tokenizer_json(argv[1]);
    const auto start = std::chrono::steady_clock::now();
    ids = tokenizer.encode(text);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  int64_t checksum = 0;
  for (size_t i = 0; i < ids.size(); ++i) checksum = (checksum * 31 + ids[i] + 1) % 1000000007;
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::cout << nlohmann::json{{"implementation", "kuafu"}, {"megabytes", mb}, {"tokens", ids.size()},
                              {"mb_per_s_median", mb / seconds[seconds.size() / 2]}, {"mb_per_s_best", mb / seconds.front()},
                              {"checksum", checksum}}
                   .dump()
            << std::endl;
}

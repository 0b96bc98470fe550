// The disk tier's bandwidth (issue 55): --chunks chunks of --chunk-mib MiB written through DiskTier on
// --dir, waited for, then read back in another order, as one JSON line (GB/s each way, O_DIRECT or the page
// cache, the I/O threads). benchmarks/disk_tier_bandwidth.sh runs it beside `dd` on the same folder.
//
//   disk_tier_bandwidth --dir /scratch --chunks 32 --chunk-mib 64 [--threads 2 --cached]
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "benchmarks/options_main.h"
#include "core/memory/disk_tier.h"

namespace {
namespace po = boost::program_options;
using kuafu::memory::DiskTier;
using kuafu::memory::DiskTransfer;

double seconds_of(const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run(const po::variables_map& args) {
  const int64_t chunks = args["chunks"].as<int64_t>(), bytes = args["chunk-mib"].as<int64_t>() << 20;
  const bool cached = args.count("cached") > 0;
  // The chunks' host memory, page-aligned as pinned buffers are: every chunk its own buffer, as Gemini's.
  std::vector<std::unique_ptr<char, decltype(&std::free)>> buffers;
  for (int64_t c = 0; c < chunks; ++c) {
    buffers.emplace_back(static_cast<char*>(std::aligned_alloc(4096, static_cast<size_t>(bytes))), &std::free);
    std::memset(buffers.back().get(), static_cast<int>(c), static_cast<size_t>(bytes));
  }
  DiskTier tier({args["dir"].as<std::string>(), 0, args["threads"].as<int>(), !cached});
  const double write_s = seconds_of([&] {
    std::vector<DiskTransfer> writes;
    for (int64_t c = 0; c < chunks; ++c) writes.push_back(tier.write(c, buffers[static_cast<size_t>(c)].get(), bytes));
    for (const DiskTransfer& w : writes) w.wait();
  });
  const double read_s = seconds_of([&] {
    std::vector<DiskTransfer> reads;
    for (int64_t c = chunks; c-- > 0;) reads.push_back(tier.read(c, buffers[static_cast<size_t>(c)].get(), bytes));
    for (const DiskTransfer& r : reads) r.wait();
  });
  for (int64_t c = 0; c < chunks; ++c) {
    if (buffers[static_cast<size_t>(c)].get()[bytes - 1] != static_cast<char>(c)) throw std::runtime_error("chunk read back wrong");
  }
  const double total = static_cast<double>(chunks * bytes);
  std::cout << nlohmann::json{{"impl", "disk_tier"}, {"dir", args["dir"].as<std::string>()}, {"direct", tier.direct()},
                              {"threads", args["threads"].as<int>()}, {"chunks", chunks}, {"chunk_mib", bytes >> 20},
                              {"write_gb_per_s", total / write_s / 1e9}, {"read_gb_per_s", total / read_s / 1e9},
                              {"write_s", write_s}, {"read_s", read_s}}.dump()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description options("disk_tier_bandwidth: the disk tier's write and read bandwidth");
  options.add_options()("dir", po::value<std::string>()->default_value("/tmp"), "memory.disk_dir")(
      "chunks", po::value<int64_t>()->default_value(32), "chunks")("chunk-mib", po::value<int64_t>()->default_value(64), "MiB a chunk")(
      "threads", po::value<int>()->default_value(2), "I/O threads")("cached", "through the page cache (no O_DIRECT)");
  return kuafu::benchmarks::options_main(argc, argv, "disk_tier_bandwidth", options, run);
}

#include "core/io/token_file.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace kuafu::io {

// Tokens are stored and mapped as raw little-endian integers; every platform we build for is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files assume a little-endian host");

namespace {

std::string errno_text() { return std::strerror(errno); }

// A mapped file truncated in place (another program rewriting it during training) makes reading the
// lost pages raise SIGBUS. While a window is copied, this thread's SIGBUS jumps back to the copy, which
// then fails with the file's name; any other SIGBUS keeps its default action.
thread_local sigjmp_buf* t_copy_in_progress = nullptr;

void on_bus_error(int signal, siginfo_t* /*info*/, void* /*context*/) {
  if (t_copy_in_progress) siglongjmp(*t_copy_in_progress, 1);
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

void catch_bus_errors() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action {};
    action.sa_sigaction = on_bus_error;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, nullptr);
  });
}

uint32_t bytes_per_token_for(uint64_t vocab_size) { return vocab_size <= 65535 ? 2 : 4; }

// Appends tokens at their on-disk width.
template <typename T>
void append_tokens(std::string& out, const std::vector<uint32_t>& tokens) {
  const size_t offset = out.size();
  out.resize(offset + tokens.size() * sizeof(T));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const T id = static_cast<T>(tokens[i]);
    std::memcpy(&out[offset + i * sizeof(T)], &id, sizeof(T));
  }
}

std::string printable(const unsigned char* bytes, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = bytes[i];
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

template <typename T>
T read_le(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Index of the first id >= vocab_size, or `count` when all are in range.
template <typename T>
uint64_t first_bad_id(const T* ids, uint64_t count, uint64_t vocab_size) {
  for (uint64_t i = 0; i < count; ++i) {
    if (ids[i] >= vocab_size) return i;
  }
  return count;
}

}  // namespace

void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, uint64_t vocab_size) {
  KUAFU_CHECK(vocab_size > 0, "token file ", path, ": vocab size must be positive");
  KUAFU_CHECK(vocab_size <= (uint64_t{1} << 32), "token file ", path, ": vocab size ", vocab_size,
              " does not fit 32-bit token ids");
  for (size_t i = 0; i < tokens.size(); ++i) {
    KUAFU_CHECK(tokens[i] < vocab_size, "token file ", path, ": token ", tokens[i], " at index ", i,
                " >= vocab size ", vocab_size);
  }
  const uint32_t width = bytes_per_token_for(vocab_size);

  unsigned char header[kTokenFileHeaderBytes];
  const uint64_t count = tokens.size();
  std::memcpy(header, kTokenFileMagic, 8);
  std::memcpy(header + 8, &kTokenFileVersion, 4);
  std::memcpy(header + 12, &width, 4);
  std::memcpy(header + 16, &vocab_size, 8);
  std::memcpy(header + 24, &count, 8);

  std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
  if (width == 2) {
    append_tokens<uint16_t>(bytes, tokens);
  } else {
    append_tokens<uint32_t>(bytes, tokens);
  }
  write_file_atomic(path, bytes);
}

TokenFile TokenFile::open(const std::string& path, bool check_ids) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KUAFU_CHECK(fd >= 0, "cannot open token file ", path, ": ", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    fail("cannot stat token file " + path + ": " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("token file " + path + (S_ISDIR(st.st_mode) ? " is a folder, not a file" : " is not a regular file"));
  }
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    fail("token file " + path + " has " + std::to_string(file_bytes) + " bytes, less than the " +
         std::to_string(kTokenFileHeaderBytes) + "-byte header — truncated or not a token file?");
  }

  TokenFile file;
  file.path_ = path;
  file.map_bytes_ = static_cast<size_t>(file_bytes);
  void* map = ::mmap(nullptr, file.map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  const std::string map_error = map == MAP_FAILED ? errno_text() : "";
  ::close(fd);  // the mapping keeps the file alive
  KUAFU_CHECK(map != MAP_FAILED, "cannot mmap token file ", path, ": ", map_error);
  file.map_ = map;  // from here on the destructor unmaps, also when a check below throws

  const auto* bytes = static_cast<const unsigned char*>(map);
  KUAFU_CHECK(std::memcmp(bytes, kTokenFileMagic, 8) == 0, "token file ", path,
              ": expected magic KUAFUTOK, found \"", printable(bytes, 8), "\"");
  const auto version = read_le<uint32_t>(bytes + 8);
  KUAFU_CHECK(version == kTokenFileVersion, "token file ", path, ": unsupported format version ", version,
              " (this build reads version ", kTokenFileVersion, ")");
  file.bytes_per_token_ = read_le<uint32_t>(bytes + 12);
  KUAFU_CHECK(file.bytes_per_token_ == 2 || file.bytes_per_token_ == 4, "token file ", path,
              ": header says ", file.bytes_per_token_, " bytes per token, expected 2 or 4");
  file.vocab_size_ = read_le<uint64_t>(bytes + 16);
  KUAFU_CHECK(file.vocab_size_ > 0 && file.vocab_size_ <= (uint64_t{1} << 32), "token file ", path,
              ": implausible vocab size ", file.vocab_size_);
  file.size_ = read_le<uint64_t>(bytes + 24);

  // Compare in a way that cannot overflow, even for a garbage count.
  const uint64_t payload = file_bytes - kTokenFileHeaderBytes;
  if (file.size_ > payload / file.bytes_per_token_) {
    // The bytes the header claims, which a garbage count can push past 64 bits (converting such a
    // floating-point product back to an integer was undefined behaviour; found by fuzz_token_file).
    uint64_t claimed = 0;
    const bool fits = !__builtin_mul_overflow(file.size_, uint64_t{file.bytes_per_token_}, &claimed) &&
                      !__builtin_add_overflow(claimed, kTokenFileHeaderBytes, &claimed);
    fail("token file " + path + ": header says " + std::to_string(file.size_) + " tokens (" +
         (fits ? std::to_string(claimed) : std::string("more than 2^64")) + " bytes) but the file has " +
         std::to_string(file_bytes) + " bytes — truncated?");
  }
  const uint64_t expected = file.size_ * file.bytes_per_token_ + kTokenFileHeaderBytes;
  KUAFU_CHECK(expected == file_bytes, "token file ", path, ": header says ", file.size_, " tokens (",
              expected, " bytes) but the file has ", file_bytes, " bytes — trailing garbage?");
  file.tokens_ = bytes + kTokenFileHeaderBytes;

  if (check_ids) {
    const uint64_t bad =
        file.bytes_per_token_ == 2
            ? first_bad_id(reinterpret_cast<const uint16_t*>(file.tokens_), file.size_, file.vocab_size_)
            : first_bad_id(reinterpret_cast<const uint32_t*>(file.tokens_), file.size_, file.vocab_size_);
    KUAFU_CHECK(bad == file.size_, "token file ", path, ": token ", file.at(bad), " at index ", bad,
                " >= vocab size ", file.vocab_size_);
  }
  return file;
}

TokenFile::TokenFile(TokenFile&& other) noexcept { *this = std::move(other); }

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    size_ = std::exchange(other.size_, 0);
    vocab_size_ = std::exchange(other.vocab_size_, 0);
    bytes_per_token_ = std::exchange(other.bytes_per_token_, 0);
  }
  return *this;
}

TokenFile::~TokenFile() { release(); }

void TokenFile::release() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
}

uint32_t TokenFile::at(uint64_t i) const {
  KUAFU_CHECK(i < size_, "token file ", path_, ": index ", i, " out of range (", size_, " tokens)");
  if (bytes_per_token_ == 2) return reinterpret_cast<const uint16_t*>(tokens_)[i];
  return reinterpret_cast<const uint32_t*>(tokens_)[i];
}

void TokenFile::copy_window(uint64_t offset, uint64_t length, int64_t* out) const {
  KUAFU_CHECK(offset <= size_ && length <= size_ - offset, "token file ", path_, ": window [", offset, ", ",
              offset, "+", length, ") out of range (", size_, " tokens)");
  catch_bus_errors();
  sigjmp_buf lost_pages;
  if (sigsetjmp(lost_pages, 1) != 0) {
    t_copy_in_progress = nullptr;
    struct stat st {};
    const std::string now = ::stat(path_.c_str(), &st) == 0 ? std::to_string(st.st_size) + " bytes" : "gone";
    fail(detail::concat("token file ", path_, " shrank while training read it (mapped ", map_bytes_, " bytes, now ", now,
                        "): it was truncated or rewritten in place. Write a new file and rename it over the old one"));
  }
  t_copy_in_progress = &lost_pages;
  // Plain widening loops; the compiler vectorizes both.
  if (bytes_per_token_ == 2) {
    const auto* src = reinterpret_cast<const uint16_t*>(tokens_) + offset;
    for (uint64_t i = 0; i < length; ++i) out[i] = src[i];
  } else {
    const auto* src = reinterpret_cast<const uint32_t*>(tokens_) + offset;
    for (uint64_t i = 0; i < length; ++i) out[i] = src[i];
  }
  t_copy_in_progress = nullptr;
}

std::vector<uint64_t> TokenFile::histogram() const {
  std::vector<uint64_t> counts(vocab_size_, 0);
  const auto count_all = [&](const auto* ids) {
    for (uint64_t i = 0; i < size_; ++i) {
      // Ids are unchecked when the file was opened with check_ids = false.
      KUAFU_CHECK(ids[i] < vocab_size_, "token file ", path_, ": token ", ids[i], " at index ", i,
                  " >= vocab size ", vocab_size_);
      ++counts[ids[i]];
    }
  };
  if (bytes_per_token_ == 2) {
    count_all(reinterpret_cast<const uint16_t*>(tokens_));
  } else {
    count_all(reinterpret_cast<const uint32_t*>(tokens_));
  }
  return counts;
}

double unigram_entropy_nats(const TokenFile& file) {
  KUAFU_CHECK(file.size() > 0, "token file ", file.path(), " is empty: its unigram entropy is undefined");
  // Memory follows the tokens, not the header's claim: a vocab size of 2^30 in a file of seven tokens
  // asked for 8 GiB of counters (found by fuzz_token_file). Such a file counts its ids in a map, in id
  // order as the histogram would, so the sum below adds the same terms in the same order.
  std::vector<uint64_t> counts;
  if (file.vocab_size() <= file.size()) {
    counts = file.histogram();
  } else {
    std::map<uint32_t, uint64_t> by_id;
    for (uint64_t i = 0; i < file.size(); ++i) {
      const uint32_t id = file.at(i);
      KUAFU_CHECK(id < file.vocab_size(), "token file ", file.path(), ": token ", id, " at index ", i,
                  " >= vocab size ", file.vocab_size());
      ++by_id[id];
    }
    for (const auto& [id, count] : by_id) counts.push_back(count);
  }
  const double total = static_cast<double>(file.size());
  double entropy = 0.0;
  for (const uint64_t count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / total;
    entropy -= p * std::log(p);
  }
  return entropy;
}

}  // namespace kuafu::io

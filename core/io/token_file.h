// Token files: a flat binary array of token ids behind a 32-byte header, written atomically and
// read back through a read-only memory map so data loaders never copy the whole corpus.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kuafu::io {

// Layout (little-endian):
//   offset  0  char[8]  magic "KUAFUTOK"
//   offset  8  u32      format version (kTokenFileVersion)
//   offset 12  u32      bytes per token: 2 when vocab_size <= 65535, else 4
//   offset 16  u64      vocab size (every id is < this)
//   offset 24  u64      token count
//   offset 32  tokens, each u16 or u32
inline constexpr char kTokenFileMagic[8] = {'K', 'U', 'A', 'F', 'U', 'T', 'O', 'K'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr uint64_t kTokenFileHeaderBytes = 32;

// Writes `tokens` to `path` via path + ".tmp", fsync and rename, so `path` is either absent, the
// old file, or the complete new one. Throws kuafu::Error if an id is >= vocab_size.
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, uint64_t vocab_size);

class TokenFile {
 public:
  // Maps `path` and validates the header and file size. With `check_ids` every id is also compared
  // with the vocab size: one pass at memory speed, skip it only for very large files.
  static TokenFile open(const std::string& path, bool check_ids = true);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  uint64_t size() const { return size_; }
  uint64_t vocab_size() const { return vocab_size_; }
  uint32_t bytes_per_token() const { return bytes_per_token_; }
  const std::string& path() const { return path_; }

  // Bounds-checked single id.
  uint32_t at(uint64_t i) const;
  // Fills out[0..length) with the ids at [offset, offset + length): the loader's fast path.
  void copy_window(uint64_t offset, uint64_t length, int64_t* out) const;
  // Count per token id; the result has vocab_size() entries.
  std::vector<uint64_t> histogram() const;

 private:
  TokenFile() = default;
  void release() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  uint64_t size_ = 0;
  uint64_t vocab_size_ = 0;
  uint32_t bytes_per_token_ = 0;
};

// -sum p log p over the file's unigram frequencies, in nats: the loss a model that ignores context
// would reach, directly comparable with a cross-entropy loss. Throws on an empty file.
double unigram_entropy_nats(const TokenFile& file);

}  // namespace kuafu::io

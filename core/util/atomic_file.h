// Crash-safe file writing: data goes to a temporary name, is fsync'ed, then renamed over the target,
// so a reader sees either the old file or the complete new one, never a torn one. Folders likewise.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace kuafu {

// Writes `bytes` to `path` atomically (temporary file in the same folder, fsync, rename, fsync folder).
void write_file_atomic(const std::string& path, std::string_view bytes);

// What a written file holds, as a checkpoint manifest records it.
struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
// The same, streamed: `fill` hands the file's bytes to `write` piece by piece, so that no copy of the
// whole file is built in memory. Returns the size and CRC-32 of what was written.
using ByteSink = std::function<void(const void* data, size_t bytes)>;
FileSum write_file_atomic_streamed(const std::string& path, const std::function<void(const ByteSink& write)>& fill);

// fsync of a file or folder by path (folders: makes a completed rename durable).
void fsync_path(const std::string& path);

// Renames `from` to `to` and fsyncs the parent folder of `to`.
void rename_durable(const std::string& from, const std::string& to);

// Writes a new folder `dir` whole or not at all: `fill` writes its files into a folder beside it
// (<dir>.partial-<pid>), renamed to `dir` once `fill` returns; if `fill` throws, that folder is removed
// and the error passes on. An existing `dir` is refused (nothing saved is overwritten), and the partial
// folders of writers into `dir` that died before finishing are removed first.
void write_folder_atomic(const std::string& dir, const std::function<void(const std::filesystem::path& building)>& fill);

// The whole file as bytes; kuafu::Error naming the path when it cannot be read.
std::string read_file(const std::string& path);

// CRC-32 (zlib) of a file's contents, streamed.
uint32_t file_crc32(const std::string& path);

}  // namespace kuafu

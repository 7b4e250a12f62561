// src/checkpoint/file_io.hpp — POSIX file helpers for checkpoints: atomic writes, ranged reads, listings.
//
// Every failure raises Error(io) naming the path and the system's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shardopt {
namespace checkpoint {

// Checkpoint files hold raw little-endian data written straight from memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoints assume a little-endian host");

std::string join_path(const std::string& dir, const std::string& name);
void make_directories(const std::string& dir);
bool file_exists(const std::string& path);
bool directory_exists(const std::string& path);
// Whether `path` opens for reading (false when it does not exist). An open, not a stat: on a
// networked filesystem it revalidates what this client cached about files others created.
bool can_open(const std::string& path);
// `path` made absolute and free of links when it exists (messages: relative paths from other
// working directories are a common way for ranks to miss each other's files); else `path`.
std::string absolute_path(const std::string& path);
void remove_directory_if_empty(const std::string& dir);  // never raises, like remove_file_if_present
// -1 when the file does not exist.
int64_t file_size_or_missing(const std::string& path);
std::string read_whole_file(const std::string& path);
std::vector<std::string> list_directory(const std::string& dir);
void remove_file_if_present(const std::string& path);  // never raises: clean-up is best effort
// Makes renames inside `dir` durable: without it a crash may forget a rename that returned.
void fsync_directory(const std::string& dir);

// Writes `final_path` through a temporary name in the same directory: the final name appears
// only, complete and fsynced, at commit(). Destroyed uncommitted, it removes the temporary.
// Keeps the CRC32C and size of everything written.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string final_path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, std::size_t bytes);
  void write_zeros(std::size_t bytes);
  void commit();  // fsync, close, rename over final_path (the directory is the caller's to fsync)

  uint32_t crc32c() const { return crc_; }
  int64_t bytes() const { return bytes_; }
  const std::string& path() const { return final_path_; }

 private:
  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  uint32_t crc_ = 0;
  int64_t bytes_ = 0;
};

// Read-only file for positioned reads.
class InputFile {
 public:
  explicit InputFile(std::string path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Exactly `bytes` at `offset`, or Error(corrupt) if the file ends first.
  void read_at(int64_t offset, void* out, std::size_t bytes) const;
  // CRC32C of the whole file, streamed in large blocks.
  uint32_t crc32c_of_all(int64_t size) const;
  int64_t size() const;  // of the open file (fstat), not of whatever the path names now
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace checkpoint
}  // namespace shardopt

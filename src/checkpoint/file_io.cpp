// src/checkpoint/file_io.cpp — POSIX implementations of the checkpoint file helpers.
#include "checkpoint/file_io.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "checkpoint/crc32c.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

// Large enough that per-call overhead vanishes, small enough to stay in cache-friendly bursts.
constexpr std::size_t kIoBlock = std::size_t{8} << 20;

std::string reason() { return std::strerror(errno); }

}  // namespace

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

void make_directories(const std::string& dir) {
  SHARDOPT_CHECK(!dir.empty(), invalid_argument, "checkpoint directory name is empty");
  std::string partial;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST) {
      raise(ErrorCode::io, "cannot create directory '{}': {}", partial, reason());
    }
  }
  struct stat st {};
  SHARDOPT_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), io, "'{}' is not a directory", dir);
}

bool file_exists(const std::string& path) { return file_size_or_missing(path) >= 0; }

bool directory_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool can_open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  if (errno == ENOENT) return false;
  raise(ErrorCode::io, "cannot open '{}': {}", path, reason());
}

std::string absolute_path(const std::string& path) {
  std::unique_ptr<char, void (*)(void*)> resolved(::realpath(path.c_str(), nullptr), std::free);
  return resolved ? std::string(resolved.get()) : path;
}

void remove_directory_if_empty(const std::string& dir) { ::rmdir(dir.c_str()); }

int64_t file_size_or_missing(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return -1;
    raise(ErrorCode::io, "cannot stat '{}': {}", path, reason());
  }
  SHARDOPT_CHECK(S_ISREG(st.st_mode), io, "'{}' is not a regular file", path);
  return static_cast<int64_t>(st.st_size);
}

std::string read_whole_file(const std::string& path) {
  const int64_t size = file_size_or_missing(path);
  SHARDOPT_CHECK(size >= 0, io, "'{}' does not exist", path);
  std::string text(static_cast<std::size_t>(size), '\0');
  InputFile file(path);
  file.read_at(0, text.data(), text.size());
  return text;
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  SHARDOPT_CHECK(d != nullptr, io, "cannot list directory '{}': {}", dir, reason());
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void remove_file_if_present(const std::string& path) { ::unlink(path.c_str()); }

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  SHARDOPT_CHECK(fd >= 0, io, "cannot open directory '{}' to fsync it: {}", dir, reason());
  const int rc = ::fsync(fd);
  const std::string why = rc != 0 ? reason() : "";
  ::close(fd);
  // Some filesystems cannot fsync directories (EINVAL); they order renames themselves.
  SHARDOPT_CHECK(rc == 0 || why == std::strerror(EINVAL), io, "fsync of directory '{}' failed: {}", dir, why);
}

// ---- AtomicFileWriter -------------------------------------------------------------------------

AtomicFileWriter::AtomicFileWriter(std::string final_path) : final_path_(std::move(final_path)) {
  const std::size_t slash = final_path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : final_path_.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? final_path_ : final_path_.substr(slash + 1);
  // A dot name: checkpoint listings skip it, and clean-up of a crashed save finds it.
  temp_path_ = dir + "." + name + ".tmp";
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SHARDOPT_CHECK(fd_ >= 0, io, "cannot create '{}': {}", temp_path_, reason());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, std::size_t bytes) {
  SHARDOPT_CHECK(fd_ >= 0, internal, "write to '{}' after commit", final_path_);
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const std::size_t chunk = std::min(bytes, kIoBlock);
    crc_ = crc32c_update(crc_, p, chunk);
    std::size_t done = 0;
    while (done < chunk) {
      const ssize_t n = ::write(fd_, p + done, chunk - done);
      if (n < 0 && errno == EINTR) continue;
      SHARDOPT_CHECK(n > 0, io, "writing '{}' failed: {}", temp_path_, n < 0 ? reason() : "no progress");
      done += static_cast<std::size_t>(n);
    }
    bytes_ += static_cast<int64_t>(chunk);
    p += chunk;
    bytes -= chunk;
  }
}

void AtomicFileWriter::write_zeros(std::size_t bytes) {
  static const std::vector<char> zeros(std::size_t{1} << 16, 0);  // immutable
  while (bytes > 0) {
    const std::size_t chunk = std::min(bytes, zeros.size());
    write(zeros.data(), chunk);
    bytes -= chunk;
  }
}

void AtomicFileWriter::commit() {
  SHARDOPT_CHECK(fd_ >= 0, internal, "'{}' committed twice", final_path_);
  SHARDOPT_CHECK(::fsync(fd_) == 0, io, "fsync of '{}' failed: {}", temp_path_, reason());
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    const std::string why = reason();
    ::unlink(temp_path_.c_str());
    raise(ErrorCode::io, "closing '{}' failed: {}", temp_path_, why);
  }
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    const std::string why = reason();
    ::unlink(temp_path_.c_str());
    raise(ErrorCode::io, "renaming '{}' to '{}' failed: {}", temp_path_, final_path_, why);
  }
}

// ---- InputFile --------------------------------------------------------------------------------

InputFile::InputFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    if (errno == ENOENT) raise(ErrorCode::io, "'{}' is missing", path_);
    raise(ErrorCode::io, "cannot open '{}': {}", path_, reason());
  }
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(int64_t offset, void* out, std::size_t bytes) const {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, std::min(bytes, kIoBlock), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    SHARDOPT_CHECK(n >= 0, io, "reading '{}' at byte {} failed: {}", path_, offset, reason());
    SHARDOPT_CHECK(n > 0, corrupt, "'{}' ends at byte {}, before the data it should hold (truncated?)", path_, offset);
    p += n;
    offset += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

int64_t InputFile::size() const {
  struct stat st {};
  SHARDOPT_CHECK(::fstat(fd_, &st) == 0, io, "cannot stat '{}': {}", path_, reason());
  return static_cast<int64_t>(st.st_size);
}

uint32_t InputFile::crc32c_of_all(int64_t size) const {
  std::vector<char> block(static_cast<std::size_t>(std::min<int64_t>(size, static_cast<int64_t>(kIoBlock))));
  uint32_t crc = 0;
  for (int64_t offset = 0; offset < size;) {
    const std::size_t chunk = static_cast<std::size_t>(std::min<int64_t>(size - offset, static_cast<int64_t>(block.size())));
    read_at(offset, block.data(), chunk);
    crc = crc32c_update(crc, block.data(), chunk);
    offset += static_cast<int64_t>(chunk);
  }
  return crc;
}

}  // namespace checkpoint
}  // namespace shardopt
